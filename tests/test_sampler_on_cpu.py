"""Length-aware resampler (issue 5): the pure core, and the glue against the real patched verl on CPU.

verl's patched ``create_rl_sampler`` builds our sampler from a composed verl config; a torchdata
``StatefulDataLoader`` over a real ``RLHFDataset`` (shipped GSM8K sample, real Qwen3 tokenizer) yields
every index once per epoch; ``update`` through verl's ``DataProto`` reorders the next epoch; a
checkpoint taken mid-epoch resumes the identical sequence; ``dataloader_num_workers > 0`` is refused.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch

from npu_rl import REPO_ROOT
from npu_rl.sampler import (
    LengthAwareEpochSampler,
    active_sampler,
    build_custom_sampler,
    update_from_dataproto,
    update_from_v1_batch,
)
from npu_rl.sampler.core import LengthTable, OrderParams, epoch_order

pytest.importorskip("verl")
DATA = REPO_ROOT / "tests" / "data"


# ---- pure core ----------------------------------------------------------------------------------
def test_ema_follows_the_decay_and_unseen_prompts_get_the_running_mean():
    t = LengthTable(4, decay=0.7)
    assert np.isnan(t.predict(0))  # nothing known yet
    t.update(np.array([0, 1]), np.array([100.0, 300.0]))
    t.update(np.array([0]), np.array([200.0]))
    assert t.predict(0) == pytest.approx(0.7 * 100 + 0.3 * 200)  # 130
    assert t.predict(1) == 300.0
    assert t.predict(3) == pytest.approx((130 + 300) / 2)  # prior: mean of the seen prompts
    with pytest.raises(ValueError, match="outside the length table"):
        t.update(np.array([4]), np.array([1.0]))
    with pytest.raises(ValueError, match="ema_decay"):
        LengthTable(3, decay=1.0)


def test_epoch_order_is_a_deterministic_permutation_with_a_random_tail():
    pred = np.full(22, np.nan)
    p = OrderParams(batch_size=5)
    a, tail = epoch_order(pred, p, seed=7, epoch=3)
    b, _ = epoch_order(pred, p, seed=7, epoch=3)
    c, _ = epoch_order(pred, p, seed=7, epoch=4)
    assert tail == 2 and sorted(a) == list(range(22))
    assert (a == b).all() and not (a == c).all()
    tails = {tuple(sorted(epoch_order(pred, p, seed=7, epoch=e)[0][-2:])) for e in range(20)}
    assert len(tails) > 10  # a different pair sits out each epoch, not the same prompts every time


def test_epoch_order_puts_similar_predictions_into_one_generation_batch():
    rng = np.random.default_rng(0)
    levels = np.repeat([500.0, 3000.0, 9000.0, 20000.0], 8)  # four length classes, 8 prompts each
    pred = rng.permutation(levels)
    order, tail = epoch_order(pred, OrderParams(batch_size=8, bucket_size=1024), seed=1, epoch=1)
    assert tail == 0
    blocks = pred[order].reshape(4, 8)
    assert all(len(set(row)) == 1 for row in blocks)  # each generation batch is one class
    asc, _ = epoch_order(pred, OrderParams(batch_size=8, shuffle_batch_blocks=False), seed=1, epoch=1)
    assert list(pred[asc].reshape(4, 8)[:, 0]) == [500.0, 3000.0, 9000.0, 20000.0]  # curriculum only if asked
    shuffled = {tuple(pred[epoch_order(pred, OrderParams(batch_size=8), seed=1, epoch=e)[0]][::8]) for e in range(8)}
    assert len(shuffled) > 1  # whole batches are shuffled across epochs


# ---- real verl on CPU -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gsm8k_parquet(tmp_path_factory):
    from npu_rl.data import main

    out = tmp_path_factory.mktemp("data")
    assert main(["gsm8k", "--input", str(DATA / "gsm8k_train_head20.jsonl"), "--out", str(out)]) == 0
    return out / "gsm8k" / "train.parquet"


def _verl_config(*overrides: str):
    """verl 0.9.1's (patched) composed trainer config with ``overrides``."""
    from hydra import compose, initialize_config_dir
    from verl.trainer import config as verl_config

    with initialize_config_dir(config_dir=str(Path(verl_config.__file__).parent), version_base=None):
        return compose("ppo_trainer", overrides=list(overrides))


def _dataset(path, tok):
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    return RLHFDataset(
        [str(path)], tok, OmegaConf.create({"max_prompt_length": 1024, "filter_overlong_prompts": False})
    )


def _loader(ds, sampler, batch_size):
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.utils.dataset.rl_dataset import collate_fn

    # as verl's trainers build it (trainer_base._init_dataloader / ray_trainer._create_dataloader)
    return StatefulDataLoader(
        ds, batch_size=batch_size, num_workers=0, drop_last=True, collate_fn=collate_fn, sampler=sampler
    )


SAMPLER_ON = ("data.sampler.class_name=LengthAwareEpochSampler", "data.dataloader_num_workers=0")


def test_patched_create_rl_sampler_builds_ours_from_the_config(gsm8k_parquet, tok):
    from verl.trainer.ppo.utils import create_rl_sampler

    ds = _dataset(gsm8k_parquet, tok)
    cfg = _verl_config(
        *SAMPLER_ON, "data.train_batch_size=4", "+data.sampler.bucket_size=512", "+data.sampler.ema_decay=0.5"
    )
    s = create_rl_sampler(cfg.data, ds)
    assert type(s) is LengthAwareEpochSampler and active_sampler() is s
    assert (s.params.batch_size, s.params.bucket_size, s.table.decay, len(s)) == (4, 512, 0.5, 20)
    # the reference recipe's class_path is accepted as an alias
    ref = _verl_config(
        *SAMPLER_ON,
        "data.train_batch_size=4",
        "data.sampler.class_path=pkg://verl.experimental.dataset.length_bucket_sampler",
    )
    assert type(create_rl_sampler(ref.data, ds)) is LengthAwareEpochSampler
    # unchanged upstream behaviour without the switch
    from torchdata.stateful_dataloader.sampler import RandomSampler

    assert type(create_rl_sampler(_verl_config().data, ds)) is RandomSampler


def test_dataloader_workers_and_unknown_keys_are_refused(gsm8k_parquet, tok):
    from verl.trainer.ppo.utils import create_rl_sampler

    ds = _dataset(gsm8k_parquet, tok)
    with pytest.raises(ValueError, match="dataloader_num_workers=0"):
        create_rl_sampler(_verl_config("data.sampler.class_name=LengthAwareEpochSampler").data, ds)  # default 8
    with pytest.raises(ValueError, match="data.sampler.bucket_szie is not a key"):
        create_rl_sampler(_verl_config(*SAMPLER_ON, "+data.sampler.bucket_szie=512").data, ds)
    with pytest.raises(ValueError, match="not a boolean"):
        create_rl_sampler(_verl_config(*SAMPLER_ON, "+data.sampler.shuffle_batch_blocks=maybe").data, ds)


def _sampler(ds, batch_size, **kw):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(
        {
            "train_batch_size": batch_size,
            "dataloader_num_workers": 0,
            "seed": 3,
            "sampler": {"class_name": "LengthAwareEpochSampler", **kw},
        }
    )
    return build_custom_sampler(cfg, ds)


def _epoch(it, steps):
    return [next(it)["dataset_index"].tolist() for _ in range(steps)]


def test_stateful_dataloader_yields_every_index_once_per_epoch(gsm8k_parquet, tok):
    ds = _dataset(gsm8k_parquet, tok)
    loader = _loader(ds, _sampler(ds, 4), 4)
    for _ in range(2):
        seen = [i for batch in loader for i in batch["dataset_index"].tolist()]
        assert sorted(seen) == list(range(20))
    # 20 prompts in batches of 6: verl drops the 2-prompt tail, a different pair each epoch, counted
    s6 = _sampler(ds, 6)
    loader6 = _loader(ds, s6, 6)
    dropped = []
    for _ in range(3):
        seen = [i for batch in loader6 for i in batch["dataset_index"].tolist()]
        assert len(seen) == len(set(seen)) == 18
        dropped.append(tuple(sorted(set(range(20)) - set(seen))))
    assert len(set(dropped)) > 1
    assert s6.update([0], [10])["sampler/tail_dropped_per_epoch"] == 2


def _lengths(index: int) -> float:
    return [400.0, 2500.0, 6000.0, 15000.0, 30000.0][index % 5]  # five length classes, 4 prompts each


def _feed(sampler, batch, n=4):
    """One step as the legacy trainer sees it: a real DataProto, n trajectories per prompt."""
    from verl import DataProto

    idx = np.repeat(np.asarray(batch["dataset_index"], dtype=np.int64), n)
    lens = torch.tensor([_lengths(int(i)) for i in idx], dtype=torch.int64)
    width = int(lens.max())
    mask = (torch.arange(width)[None, :] < lens[:, None]).to(torch.int64)
    dp = DataProto.from_dict(tensors={"response_mask": mask}, non_tensors={"dataset_index": idx.astype(object)})
    return update_from_dataproto(sampler, dp)


def test_update_reorders_the_next_epoch_by_predicted_length(gsm8k_parquet, tok):
    ds = _dataset(gsm8k_parquet, tok)
    s = _sampler(ds, 4, bucket_size=1024)
    loader = _loader(ds, s, 4)
    first = [batch["dataset_index"].tolist() for batch in loader]
    spread = [np.ptp([_lengths(i) for i in b]) for b in first]
    it = iter(loader)
    metrics = [_feed(s, next(it)) for _ in range(5)]  # epoch 2 learns; epoch 1 taught nothing (no update)
    assert metrics[0]["sampler/seen_frac"] == 0.0 and metrics[-1]["sampler/table_coverage"] == 1.0
    third = [b["dataset_index"].tolist() for b in loader]
    assert all(len({_lengths(i) for i in b}) == 1 for b in third)  # every batch is one length class
    assert max(spread) > 0  # the random first epoch mixed classes
    m = _feed(s, {"dataset_index": third[0]})
    assert m["sampler/pred_abs_err"] == 0.0 and m["sampler/batch_len_cv"] == 0.0


def _save(loader) -> bytes:
    buf = io.BytesIO()
    torch.save(loader.state_dict(), buf)  # what verl writes to data.pt
    return buf.getvalue()


def test_checkpoint_mid_epoch_resumes_the_identical_sequence(gsm8k_parquet, tok):
    ds = _dataset(gsm8k_parquet, tok)
    s = _sampler(ds, 4)
    loader = _loader(ds, s, 4)
    it = iter(loader)
    for _ in range(5):
        _feed(s, next(it))  # epoch 0 with updates
    it = iter(loader)
    for _ in range(2):
        _feed(s, next(it))  # two steps into epoch 1
    blob = _save(loader)
    rest = []
    for batch in it:
        rest.append(batch["dataset_index"].tolist())
        _feed(s, batch)
    rest += [b["dataset_index"].tolist() for b in loader]  # and the whole next epoch

    ds2 = _dataset(gsm8k_parquet, tok)
    s2 = _sampler(ds2, 4)
    loader2 = _loader(ds2, s2, 4)
    loader2.load_state_dict(torch.load(io.BytesIO(blob), weights_only=False))
    again = []
    for batch in loader2:
        again.append(batch["dataset_index"].tolist())
        _feed(s2, batch)
    again += [b["dataset_index"].tolist() for b in loader2]
    assert again == rest and len(rest) == 3 + 5
    assert np.allclose(s2.predictions(), s.predictions())


class _TqReader:
    """TransferQueue's kv_batch_get for the dataset_index field, over rows stored the way verl's agent
    loop writes trajectories (``list_of_dict_to_tensordict`` of the prompt fields)."""

    def __init__(self, index_of: dict[str, int]):
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        self.keys = list(index_of)
        self.store = list_of_dict_to_tensordict([{"dataset_index": i, "x": 0.0} for i in index_of.values()])

    def kv_batch_get(self, keys, partition_id, select_fields):
        assert partition_id == "train" and select_fields == ["dataset_index"]
        col = self.store.select(*select_fields)["dataset_index"]
        return {"dataset_index": [col[self.keys.index(k)] for k in keys]}


def test_v1_hook_reads_lengths_from_tags_and_skips_padding(gsm8k_parquet, tok):
    from transfer_queue import KVBatchMeta

    ds = _dataset(gsm8k_parquet, tok)
    s = _sampler(ds, 4)
    keys = ["a_0_0", "a_1_0", "b_0_0", "pad"]
    tags = [{"response_len": 100}, {"response_len": 300}, {"response_len": 50}, {"response_len": 9, "is_padding": True}]
    meta = KVBatchMeta(partition_id="train", keys=keys, tags=tags)
    m = update_from_v1_batch(s, meta, _TqReader({"a_0_0": 7, "a_1_0": 7, "b_0_0": 2}))
    assert s.predict(7) == 200.0 and s.predict(2) == 50.0 and m["sampler/seen_frac"] == 0.0
    assert update_from_v1_batch(object(), meta, None) == {}  # a sampler without update(): nothing


# ---- preflight ------------------------------------------------------------------------------------
def test_preflight_accepts_the_reference_names_and_refuses_bad_sampler_settings():
    from npu_rl.preflight import run_preflight
    from tests.test_preflight_on_cpu import BASE, ENV_2X16

    ref = [  # the reference recipe's lines, verbatim (its class_path is an alias)
        "data.sampler.class_path=pkg://verl.experimental.dataset.length_bucket_sampler",
        "data.sampler.class_name=LengthAwareEpochSampler",
        "+data.sampler.bucket_size=1024",
        "+data.sampler.ema_decay=0.7",
        "+data.sampler.shuffle_batch_blocks=True",
        "data.dataloader_num_workers=0",
        "data.shuffle=False",
    ]
    r = run_preflight([*BASE, *ref], ENV_2X16)
    assert r.ok, r.render()
    assert "length-aware resampler" in dict(r.plan)["features on"]
    assert [w.key for w in r.report.warnings if w.key.startswith("data.sampler")] == ["data.sampler.class_path"]

    bad = run_preflight(
        [
            *BASE,
            "data.sampler.class_name=LengthAwareEpochSampler",
            "+data.sampler.bucket_szie=512",
            "+data.sampler.ema_decay=1.5",
        ],
        {**ENV_2X16, "VLLM_ROLLOUT_EARLY_STOP_FACTOR": "two"},
    )
    e = {p.key: p for p in bad.report.errors}
    assert "needs 0" in e["data.dataloader_num_workers"].message  # verl's default of 8 workers
    assert e["data.sampler.bucket_szie"].fix == "did you mean +data.sampler.bucket_size?"
    assert "not in [0, 1)" in e["data.sampler.ema_decay"].message
    assert "'two' is not a number" in e["VLLM_ROLLOUT_EARLY_STOP_FACTOR"].message
    sglang = run_preflight(
        [*BASE, "actor_rollout_ref.rollout.name=sglang"], {**ENV_2X16, "VLLM_ROLLOUT_EARLY_STOP_ENABLE": "1"}
    )
    assert (
        "hooks verl's vLLM server" in {p.key: p for p in sglang.report.errors}["VLLM_ROLLOUT_EARLY_STOP_ENABLE"].message
    )
    off = run_preflight([*BASE, "+data.sampler.bucket_size=512"], ENV_2X16)
    assert off.ok and any("do nothing" in w.message for w in off.report.warnings)


def test_the_32b_recipe_switches_the_sampler_on_and_passes_the_dry_run():
    from tests.dryrun import plan

    rc, out, _ = plan(REPO_ROOT / "recipes/qwen3-32b/grpo_32die.sh", REPO_ROOT / "recipes/qwen3-32b/env_2node.sh")
    assert rc == 0, out
    assert "features on     length-aware resampler" in out


def test_other_samplers_load_through_class_path_as_in_verl_0_7(gsm8k_parquet, tok, tmp_path):
    from verl.trainer.ppo.utils import create_rl_sampler

    (tmp_path / "my_sampler.py").write_text(
        "import torch.utils.data\n"
        "class Reverse(torch.utils.data.Sampler):\n"
        "    def __init__(self, data_source, data_config):\n"
        "        self.n = len(data_source)\n"
        "    def __iter__(self):\n"
        "        return iter(range(self.n - 1, -1, -1))\n"
        "    def __len__(self):\n"
        "        return self.n\n"
    )
    cfg = _verl_config(
        *SAMPLER_ON[1:], f"data.sampler.class_path={tmp_path / 'my_sampler.py'}", "data.sampler.class_name=Reverse"
    )
    s = create_rl_sampler(cfg.data, _dataset(gsm8k_parquet, tok))
    assert list(s)[:3] == [19, 18, 17]
    assert update_from_dataproto(s, None) == {}  # no update(): the trainer hook leaves it alone
