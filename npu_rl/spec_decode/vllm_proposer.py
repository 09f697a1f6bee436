"""SAM as a vLLM 0.23 V1 proposer (``speculative_config.method="sam"``), for GPUModelRunner and NPUModelRunner.

Lifecycle as upstream's ``SuffixDecodingProposer`` (vllm/v1/spec_decode/suffix_decoding.py):
per-request state is created lazily from ``input_batch.token_ids_cpu`` (prompt + output so far),
caught up incrementally from the tokens the drafter has not seen (several per step after skipped or
gated steps; a request whose tokens disagree with what the drafter saw, e.g. one preempted and
resumed under the same id with other tokens, is rebuilt), and finished when it leaves the batch (its
text stays in its prompt's group automaton, and its output goes to the history store when history
is on). Live siblings draft from each other's text as it is sampled (one group automaton per prompt,
:mod:`npu_rl.spec_decode.corpus`); :meth:`SamDrafter.tick` looks history up and attaches the
read-only history automata a worker thread builds, off the engine step.
Requests in a partial prefill, at ``max_model_len``,
or above the batch-size gate get empty drafts; the gate still catches up. Drafts are verified by
vLLM's rejection sampler like n-gram drafts (draft probability 1), so sampling and log-probs are
unchanged.
"""

from __future__ import annotations

import os
import time
from types import SimpleNamespace
from typing import Any

import numpy as np

from npu_rl import worker_log
from npu_rl.spec_decode.config import SamSettings, from_speculative_config
from npu_rl.spec_decode.corpus import SamDrafter
from npu_rl.spec_decode.history import ACTOR_NAME, ACTOR_NAMESPACE, HistoryStore, LocalHistory, RayHistory, actor_name

STATS_EVERY_S = 60.0  # the proposer logs its drafter's counters at most this often


class SamProposer:
    """The drafter vLLM's runner holds as ``self.drafter`` for method "sam".

    ``propose(input_batch, sampled_token_ids)`` has the signature of ``SuffixDecodingProposer.propose``.
    Counters: ``steps`` (propose calls), ``gated_steps`` (calls above the batch-size gate).
    """

    def __init__(self, vllm_config: Any, runner: Any = None):
        spec = vllm_config.speculative_config
        if spec is None or spec.method != "sam":
            raise ValueError("SamProposer needs speculative_config.method='sam'")
        self.settings: SamSettings = from_speculative_config(spec)
        self.num_speculative_tokens = self.settings.k
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.runner = runner
        self.steps = 0
        self.gated_steps = 0
        self._stats_at = time.monotonic()
        # a rank whose drafts vLLM drops keeps no drafter: no host memory, CPU or history traffic
        self.idle_why = _drafts_unused_here(vllm_config)
        self.drafter: SamDrafter | None = None
        if self.idle_why is not None:
            worker_log(f"SAM drafter: off on this rank: {self.idle_why}")
            return
        self.drafter = SamDrafter(
            self.settings.k,
            min_match=self.settings.min_match,
            group_budget_bytes=self.settings.group_corpus_bytes,
            adaptive_k=self.settings.adaptive_k,
            history=_history(self.settings, vllm_config),
        )
        if self.drafter.history is not None:
            scope = ""
            if isinstance(self.drafter.history, RayHistory):
                scope = f", scope {self.settings.history_scope or 'none: shared with every such engine of this model'}"
                if self.settings.history_rewards:
                    scope += ", ranked by the trainer's rewards (sam_history_rewards)"
            mib = self.settings.history_bytes >> 20
            worker_log(f"SAM history corpus: {self.drafter.history.where}, {mib} MiB{scope}")
        _compile()  # numba compiles (or loads its cache) here, not in the first decode step

    def propose(
        self, input_batch: Any, sampled_token_ids: list[list[int]], slot_mappings: Any = None
    ) -> list[list[int]]:
        """One draft (list of token ids, maybe empty) per request of ``input_batch``, in batch order."""
        drafter = self.drafter
        num_reqs = len(sampled_token_ids)
        gated = num_reqs > self.settings.max_batch
        self.steps += 1
        self.gated_steps += gated
        if drafter is None:  # not the output rank: vLLM drops these drafts
            return [[] for _ in range(num_reqs)]
        unsupported = getattr(input_batch, "spec_decode_unsupported_reqs", ())
        token_ids = input_batch.token_ids_cpu
        drafts: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            if not sampled:  # partial prefill: nothing sampled, nothing to draft
                drafts.append([])
                continue
            req_id = input_batch.req_ids[i]
            n = int(input_batch.num_tokens_no_spec[i])
            row = token_ids[i]
            room = 0 if gated or req_id in unsupported else min(self.settings.k, self.max_model_len - n - 1)
            seen = drafter.num_tokens(req_id) if req_id in drafter else 0
            if seen == 0 or seen > n or row[seen - 1] != drafter.last_token(req_id):
                drafter.start(req_id, row[:n], num_prompt=int(input_batch.num_prompt_tokens[i]))
                seen = n
            draft = drafter.step(req_id, row[seen:n], max_draft=max(room, 0))
            drafts.append(draft.tolist())
        # requests that left the batch: the runner keeps the state of the unscheduled ones (preempted,
        # or not scheduled this step: GPUModelRunner._update_states) and pops the finished ones, so
        # with a runner at hand only those are finished; an unscheduled one keeps its stream and
        # continues where it stopped. Without a runner every leaver is finished (a preempted one is
        # rebuilt when it comes back; the store keeps one copy of a response sent twice).
        cached = getattr(self.runner, "requests", None)
        for req_id in [r for r in drafter.requests if r not in input_batch.req_id_to_index]:
            if cached is None or req_id not in cached:
                drafter.finish(req_id)
        drafter.tick()
        if time.monotonic() - self._stats_at >= STATS_EVERY_S:
            self._stats_at = time.monotonic()
            worker_log(self.stats_line())
        return drafts

    def stats_line(self) -> str:
        """One log line of what the drafter did so far: steps (gated), groups, tokens and bytes per
        token, evictions, and the history's lookups, tokens built and where it lives."""
        if self.drafter is None:
            return f"SAM drafter: {self.steps} steps, off on this rank: {self.idle_why}"
        st = self.drafter.stats()
        line = (
            f"SAM drafter: {self.steps} steps ({self.gated_steps} above the batch-size gate), {st['groups']} groups, "
            f"{st['requests']} running, {st['tokens']} tokens at {st['bytes_per_token']:.0f} B/token "
            f"({st['nbytes'] >> 20} MiB of {self.settings.group_corpus_bytes >> 20}), {st['evictions']} evictions"
        )
        if self.drafter.history is not None:
            line += (
                f"; history: {st['history_lookups']} lookups, {st['history_tokens_built']} tokens built "
                f"({st['history_bytes'] >> 20} MiB), store: {st['history']}"
            )
        return line

    def load_model(self, *args, **kwargs) -> None:
        """No model to load (model-free drafter)."""

    @property
    def nbytes(self) -> int:
        """Bytes the drafter holds (running requests' automata plus the group corpus)."""
        return 0 if self.drafter is None else self.drafter.nbytes


class AscendSamProposer(SamProposer):
    """The NPUModelRunner flavour: reads the batch from ``runner.input_batch`` (vllm-ascend's calling
    convention for CPU drafters, as its ``AscendSuffixDecodingProposer``) and has the no-op
    ``dummy_run`` the NPU runner calls on every drafter while capturing graphs."""

    def __init__(self, vllm_config: Any, runner: Any):
        super().__init__(vllm_config, runner)

    def propose(  # type: ignore[override]
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray | None = None,
        token_ids_cpu: np.ndarray | None = None,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        return super().propose(self.runner.input_batch, sampled_token_ids)

    def dummy_run(self, *args, **kwargs) -> None:
        """Nothing to run: the drafter has no model."""


def _drafts_unused_here(vllm_config: Any) -> str | None:
    """Why vLLM drops this rank's drafts (None: it uses them, or this cannot tell, so the rank drafts).

    vLLM 0.23's multiprocessing executor (``mp``, what verl starts) takes the drafts of one rank only:
    ``MultiprocExecutor.take_draft_token_ids`` asks with ``unique_reply_rank=output_rank``, and a
    ``WorkerProc`` answers only when its rank (the one ``WorkerBase`` stores in
    ``parallel_config.rank``) is that one; the scheduler then sends those drafts to every rank. With
    SAM there is no asynchronous scheduling, where a rank would read its own drafts (``VllmConfig``
    turns it off for non-EAGLE drafters). The output rank is vLLM's own
    ``MultiprocExecutor._get_output_rank`` (the first rank of the last pipeline stage), called on this
    worker's parallel config, so a later vLLM's rule is followed as it is. The other executors draft on
    every rank: ``uni`` has one, with ``external_launcher`` every rank schedules from its own drafts,
    and ``ray`` and custom executors pick their rank otherwise.
    """
    parallel = getattr(vllm_config, "parallel_config", None)
    if getattr(parallel, "distributed_executor_backend", None) != "mp":
        return None
    try:
        from vllm.v1.executor.multiproc_executor import MultiprocExecutor

        executor = SimpleNamespace(world_size=parallel.world_size, parallel_config=parallel)
        output_rank = int(MultiprocExecutor._get_output_rank(executor))
        rank = int(parallel.rank)
    except (ImportError, AttributeError, TypeError, ValueError) as e:
        worker_log(
            f"SAM drafter: drafting on every rank: cannot tell which rank vLLM's mp executor takes drafts from "
            f"({type(e).__name__}: {e})"
        )
        return None
    if rank == output_rank:
        return None
    return (
        f"vLLM's mp executor takes drafts only from rank {output_rank} (MultiprocExecutor._get_output_rank: the "
        f"first rank of the last pipeline stage); this is rank {rank} of {parallel.world_size}"
    )


def _history(settings: SamSettings, vllm_config: Any = None):
    """The history store the settings ask for (None when off).

    The cluster-wide Ray actor when this process can reach Ray: it is connected already, or
    ``RAY_ADDRESS`` names the cluster. verl starts vLLM with the ``mp`` executor, so the drafter runs in
    processes vLLM spawned inside verl's server actor, where Ray is not initialized; the launcher
    sets ``RAY_ADDRESS`` on every node, and those processes inherit it. Otherwise an in-process store,
    which reaches only prompts this engine serves again, and a warning that says why.

    With vLLM's ``external_launcher`` executor every rank schedules from its own drafts, so they must
    agree; history arrives at each rank at its own step, so it is turned off there, with a warning.
    """
    if not settings.history_bytes:
        return None
    backend = getattr(getattr(vllm_config, "parallel_config", None), "distributed_executor_backend", None)
    if backend == "external_launcher":
        worker_log(
            f"warning: SAM history is off (sam_history_mb={settings.history_bytes >> 20}): with "
            "distributed_executor_backend=external_launcher every rank schedules from its own drafts, and history "
            "reaches the ranks at different steps; use the mp executor (verl's) or set sam_history_mb=0"
        )
        return None
    why = _connect_ray()
    if why is None:
        return RayHistory(
            settings.history_bytes,
            reward_weighted=True,
            scope=_history_scope(settings, vllm_config),
            await_rewards=settings.history_rewards,
        )
    worker_log(
        f"warning: SAM history: {why}, so this engine keeps an in-process store, which reaches only prompts it "
        "serves again (set RAY_ADDRESS to the cluster's address for the cluster-wide store)"
    )
    return LocalHistory(HistoryStore(settings.history_bytes))


def _history_scope(settings: SamSettings, vllm_config: Any) -> str:
    """What the history actor's name carries so that only engines of the same job share it: a digest
    of ``sam_history_scope`` (unset: the Ray job that built the engine's config, see
    :func:`npu_rl.spec_decode.config.configure_speculative_config`), the served model (path or name)
    and the history budget. The engines of one job agree on all three; another job on the same
    cluster gets its own store."""
    model = str(getattr(getattr(vllm_config, "model_config", None), "model", ""))
    return actor_name(settings.history_scope, model, settings.history_bytes).removeprefix(ACTOR_NAME + ".")


def _connect_ray() -> str | None:
    """Connect this process to the Ray cluster named by ``RAY_ADDRESS`` unless it is connected already.
    None when connected; else why not (no Ray, no address, the cluster did not answer)."""
    try:
        import ray
    except ImportError:
        return "ray is not installed"
    if ray.is_initialized():
        return None
    address = os.environ.get("RAY_ADDRESS", "")
    if not address:
        return "this process is not connected to Ray and RAY_ADDRESS is not set"
    try:
        ray.init(address=address, namespace=ACTOR_NAMESPACE, log_to_driver=False, configure_logging=False)
    except Exception as e:  # noqa: BLE001 - any failure to connect leaves the in-process store, said loudly
        return f"connecting to Ray at RAY_ADDRESS={address} failed ({type(e).__name__}: {e})"
    return None


def _compile() -> None:
    """Run every compiled path once (own match, group match, growth, history build and attach) on
    throwaway drafters: one replica's output becomes the other's history."""
    store = HistoryStore(1 << 20)
    d = SamDrafter(2, group_budget_bytes=1 << 20, adaptive_k=True, history=LocalHistory(store))
    d.start("a", np.arange(8, dtype=np.int32))
    d.step("a", np.arange(300, dtype=np.int32) % 7)
    d.finish("a")
    d.start("b", np.arange(8, dtype=np.int32))
    d.step("b", np.array([1, 2], np.int32))
    d.tick()
    other = SamDrafter(2, group_budget_bytes=1 << 20, history=LocalHistory(store), history_build="inline")
    for rid in ("c", "d"):  # attached to a running stream, then at a new stream's start
        other.start(rid, np.arange(8, dtype=np.int32))
        other.step(rid, np.array([1, 2], np.int32))
        other.tick()
        other.step(rid, np.array([3], np.int32))
