"""Random-init training runs: skip loading checkpoint weights (performance work without the weights).

A 235B checkpoint is ~470 GB; measuring throughput does not need it. With ``NPU_RL_RANDOM_INIT=1``
the trainer keeps Megatron's random initialisation instead of loading the HF weights (verl patch
``0002-verl-feature-random-init``), and the rollout starts from ``load_format=dummy`` and receives the
trainer's weights at the first sync, as usual. Only the config and tokenizer must exist
(``python -m npu_rl.models download ID --config-only``). Rewards are meaningless: throughput only.
"""

from __future__ import annotations

from collections.abc import Mapping

from npu_rl import settings

SWITCH = "NPU_RL_RANDOM_INIT"


def random_init_enabled(env: Mapping[str, str] | None = None) -> bool:
    """True when ``NPU_RL_RANDOM_INIT`` is on.

    Raises:
        SettingsError: the value is not a boolean word (1/0, true/false, yes/no, on/off).
    """
    return settings.get(SWITCH, env)
