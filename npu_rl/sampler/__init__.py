"""Length-aware resampler for verl 0.9 (``data.sampler.class_name=LengthAwareEpochSampler``).

In synchronous GRPO/DAPO every step waits for its longest response. This sampler keeps, per prompt,
an EMA of its group's mean response length and orders each epoch so that prompts of similar
predicted length share a generation batch (:func:`npu_rl.sampler.core.epoch_order`). verl 0.9 removed
the sampler plug-in (PR #6302); the verl patch ``*-verl-feature-length-aware-sampler`` restores
``data.sampler.class_path/class_name`` in ``create_rl_sampler`` and calls :func:`update_from_v1_batch`
/ :func:`update_from_dataproto` once per step, before the step's checkpoint (verl saves ``data.pt`` inside
the step), and :func:`restore_at_epoch_boundary` where the legacy trainer resumes at an epoch boundary
without restoring the dataloader. Docs: ``docs/resampler.md``.

Read API for other features (the rollout rebalance dispatcher): :func:`active_sampler` returns the
sampler the trainer built in this process (or None); its :meth:`LengthAwareEpochSampler.predict`
gives one prompt's predicted response length and :meth:`LengthAwareEpochSampler.predictions` all of
them, keyed by dataset position (the ``dataset_index`` field the patch adds to every row). The registry
is per process (the trainer driver builds the sampler): other Ray actors do not see it.
"""

# The package imports without torch: the preflight reads the keys below on every dry run, and torch
# costs seconds there. The torch sampler and its helpers load on first use (PEP 562).
from npu_rl.sampler.keys import CLASS_NAME, CLASS_PATH, DATASET_INDEX, REFERENCE_CLASS_PATH, SAMPLER_KEYS

_LAZY = (
    "LengthAwareEpochSampler",
    "active_sampler",
    "build_custom_sampler",
    "epoch_line",
    "parse_epoch_lines",
    "restore_at_epoch_boundary",
    "update_from_dataproto",
    "update_from_v1_batch",
)

__all__ = ["CLASS_NAME", "CLASS_PATH", "DATASET_INDEX", "REFERENCE_CLASS_PATH", "SAMPLER_KEYS", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        from npu_rl.sampler import epoch_sampler

        return getattr(epoch_sampler, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
