"""Rollout rebalance: length-aware, pull-based dispatch of rollout requests across vLLM replicas.

See docs/rebalance.md. Core (no vLLM, no Ray): :mod:`.predictor` (length predictions),
:mod:`.policy` (which request goes where), :mod:`.dispatcher` (asyncio front, order restoration).
verl glue: :mod:`.verl_hook` (called from the verl patch ``rollout-rebalance``).
"""

from npu_rl.rebalance.dispatcher import Dispatcher, dispatch_batch, restore_order
from npu_rl.rebalance.policy import DispatchPolicy, StepStats
from npu_rl.rebalance.predictor import (
    EMALengthPredictor,
    LengthPredictor,
    NoPredictor,
    predicted_work,
    prompt_key,
)

__all__ = [
    "DispatchPolicy",
    "Dispatcher",
    "EMALengthPredictor",
    "LengthPredictor",
    "NoPredictor",
    "StepStats",
    "dispatch_batch",
    "predicted_work",
    "prompt_key",
    "restore_order",
]
