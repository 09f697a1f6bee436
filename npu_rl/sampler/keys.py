"""The length-aware sampler's names and config keys, importable without torch (the preflight reads them)."""

from __future__ import annotations

from typing import Any

DATASET_INDEX = "dataset_index"  # field the verl patch adds in RLHFDataset.__getitem__: the row's position
CLASS_PATH = "pkg://npu_rl.sampler"
CLASS_NAME = "LengthAwareEpochSampler"
# class_path the reference recipe documented (a verl fork module that does not exist in verl 0.9.1)
REFERENCE_CLASS_PATH = "pkg://verl.experimental.dataset.length_bucket_sampler"
# keys of data.sampler this sampler reads (besides class_path/class_name), with defaults
SAMPLER_KEYS: dict[str, Any] = {"bucket_size": 1024, "ema_decay": 0.7, "shuffle_batch_blocks": True}
