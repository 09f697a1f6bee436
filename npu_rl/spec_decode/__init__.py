"""Model-free speculative decoding for RL rollouts (issue 6): the SAM drafter and its group corpus.

:mod:`npu_rl.spec_decode.sam` is the compiled suffix automaton, :mod:`npu_rl.spec_decode.corpus` the
per-request drafter state and the shared group corpus, :mod:`npu_rl.spec_decode.vllm_proposer` the
vLLM 0.23 V1 proposer (the only module here that imports vllm).
"""
