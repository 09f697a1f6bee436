"""The patch engine: ordered per-upstream series, applied all-or-nothing with git.

``apply_all_patches.sh`` is a thin wrapper over ``python -m npu_rl.patches``. Layers:
:mod:`.series` (loading and validating the series), :mod:`.engine` (check, apply, revert,
status), :mod:`.export` (the maintainer loop), :mod:`.cli` (argument parsing and exit codes).
"""
