"""The features this project adds, how each is switched, and whether this release carries it.

The declarations live in :mod:`npu_rl.settings` (one per feature and variable: type, default, range,
reader, doc); this module is the feature-level view the preflight, the launcher and the README
generator import. ``python -m npu_rl.features`` prints the README's feature table. A feature is
*available* when every patch it needs is in the series under ``patches/``; until then switching it on
is an error that says so, never a silent no-op.
"""

from __future__ import annotations

from npu_rl.settings import (
    FEATURES,
    RENAMED,
    Feature,
    FeatureState,
    features_table,
    known_env,
    own_prefixes,
)
from npu_rl.settings import check as feature_state

__all__ = [
    "FEATURES",
    "RENAMED",
    "Feature",
    "FeatureState",
    "feature_state",
    "features_table",
    "known_env",
    "own_prefixes",
]


if __name__ == "__main__":
    print(features_table())
