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

import logging
from typing import Any

import numpy as np

from npu_rl.spec_decode.config import SamSettings, from_speculative_config
from npu_rl.spec_decode.corpus import SamDrafter
from npu_rl.spec_decode.history import HistoryStore, LocalHistory, RayHistory

logger = logging.getLogger(__name__)


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
        self.drafter = SamDrafter(
            self.settings.k,
            min_match=self.settings.min_match,
            group_budget_bytes=self.settings.group_corpus_bytes,
            adaptive_k=self.settings.adaptive_k,
            history=_history(self.settings),
        )
        if self.drafter.history is not None:
            logger.info("SAM history corpus: %s, %d MiB", self.drafter.history.where, self.settings.history_bytes >> 20)
        self.runner = runner
        self.steps = 0
        self.gated_steps = 0
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
        return drafts

    def load_model(self, *args, **kwargs) -> None:
        """No model to load (model-free drafter)."""

    @property
    def nbytes(self) -> int:
        """Bytes the drafter holds (running requests' automata plus the group corpus)."""
        return self.drafter.nbytes


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


def _history(settings: SamSettings):
    """The history store the settings ask for: the cluster-wide Ray actor when this process is
    connected to Ray, else an in-process store (reaches only prompts this engine serves again)."""
    if not settings.history_bytes:
        return None
    try:
        import ray

        if ray.is_initialized():
            return RayHistory(settings.history_bytes, reward_weighted=True)
    except ImportError:
        pass
    return LocalHistory(HistoryStore(settings.history_bytes))


def _compile() -> None:
    """Run every compiled path once (own match, group match, growth, history) on a throwaway drafter."""
    d = SamDrafter(2, group_budget_bytes=1 << 20, adaptive_k=True, history=LocalHistory(HistoryStore(1 << 20)))
    d.start("a", np.arange(8, dtype=np.int32))
    d.step("a", np.arange(300, dtype=np.int32) % 7)
    d.finish("a")
    d.start("b", np.arange(8, dtype=np.int32))
    d.step("b", np.array([1, 2], np.int32))
    d.tick()
