"""The trainers a recipe can run (``run_verl --trainer NAME``): verl's entry point and Hydra config for each.

Read from the pinned verl 0.9.1 (docs/async.md):

- ``sync``: ``verl/trainer/main_ppo.py`` (``@hydra.main(config_path="config", config_name="ppo_trainer")``);
- ``fully_async``: ``verl/experimental/fully_async_policy/fully_async_main.py:222``
  (``config_path="config", config_name="fully_async_ppo_trainer"``; Megatron:
  ``--config-name=fully_async_ppo_megatron_trainer``, as verl's own scripts select it);
- ``one_step_off``: ``verl/experimental/one_step_off_policy/main_ppo.py:109``
  (``config_name="one_step_off_ppo_trainer"``; Megatron: ``one_step_off_ppo_megatron_trainer``).

A relative ``--config-path`` is relative to the entry point's folder, as for any ``@hydra.main`` app.
The experimental configs but ``fully_async_ppo_trainer.yaml`` find verl's base config through the
searchpath ``file://verl/trainer/config``, which Hydra resolves against the working directory;
``run_verl`` passes ``hydra.searchpath=[pkg://verl.trainer.config]`` so that they compose anywhere
(:data:`SEARCHPATH`), and the preflight composes with the same override.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: The override ``run_verl`` adds for the experimental trainers (internal/verl.sh).
SEARCHPATH = "hydra.searchpath=[pkg://verl.trainer.config]"


@dataclass(frozen=True)
class Trainer:
    """One ``run_verl --trainer`` choice.

    Attributes:
        name: the ``--trainer`` value.
        module: the Python module ``run_verl`` runs (``python -m``).
        package_dir: the entry point's folder below the ``verl`` package (a relative ``--config-path``
            starts there).
        config_name: its default Hydra config; ``megatron_config``: the one for the Megatron engine.
        separate_pools: trainer and rollout run on separate dies (``rollout.nnodes`` x
            ``rollout.n_gpus_per_node`` besides ``trainer.*``).
    """

    name: str
    module: str
    package_dir: str
    config_name: str
    megatron_config: str
    separate_pools: bool

    def config_dir(self, verl_dir: Path) -> Path:
        """``<verl>/<package_dir>/config``: the folder of the entry point's Hydra configs."""
        return verl_dir / self.package_dir / "config"


TRAINERS = {
    t.name: t
    for t in (
        Trainer("sync", "verl.trainer.main_ppo", "trainer", "ppo_trainer", "ppo_megatron_trainer", False),
        Trainer(
            "fully_async",
            "verl.experimental.fully_async_policy.fully_async_main",
            "experimental/fully_async_policy",
            "fully_async_ppo_trainer",
            "fully_async_ppo_megatron_trainer",
            True,
        ),
        Trainer(
            "one_step_off",
            "verl.experimental.one_step_off_policy.main_ppo",
            "experimental/one_step_off_policy",
            "one_step_off_ppo_trainer",
            "one_step_off_ppo_megatron_trainer",
            True,
        ),
    )
}


def trainer(name: str) -> Trainer:
    """The trainer called ``name``.

    Raises:
        ValueError: ``name`` is not one of :data:`TRAINERS` (the message lists them).
    """
    try:
        return TRAINERS[name]
    except KeyError:
        raise ValueError(
            f"--trainer {name!r} is not a trainer; choose one of: {', '.join(TRAINERS)} (docs/async.md)"
        ) from None
