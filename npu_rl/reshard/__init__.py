"""All-to-all-v MoE expert reshard from Megatron training ranks to colocated vLLM rollout ranks.

After a training step the rollout needs the new weights. The pinned path (mbridge 0.15.1
``Bridge.export_weights``) all-gathers every expert over the expert-parallel group, so every trainer
rank materialises all experts and vLLM then drops the ones it does not own. Here
:mod:`npu_rl.reshard.plan` works out, from the two layouts, which local expert shard each rank sends to
which rank, and :mod:`npu_rl.reshard.exchange` moves exactly those with ``all_to_all_single``; every
rank ends with the experts its rollout rank owns. :mod:`npu_rl.reshard.hook` is what the verl patch
calls. See docs/reshard.md.
"""
