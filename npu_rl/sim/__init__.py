"""Rollout simulator: a discrete-event model of one synchronous RL generation step on R vLLM replicas.

Public API (times in ms, sizes in tokens; see ``docs/sim.md``)::

    from npu_rl.sim import CostModel, ReplicaConfig, SimRequest, SimResult, simulate, lower_bound
    from npu_rl.sim.routing import Routing, VerlDefaultRouting, PullRouting
    from npu_rl.sim.workloads import Workload, load_workload, sample_step
"""

from npu_rl.sim.engine import SimState, simulate
from npu_rl.sim.model import CostModel, ReplicaConfig, SimError, SimRequest, SimResult, lower_bound

__all__ = [
    "CostModel",
    "ReplicaConfig",
    "SimError",
    "SimRequest",
    "SimResult",
    "SimState",
    "lower_bound",
    "simulate",
]
