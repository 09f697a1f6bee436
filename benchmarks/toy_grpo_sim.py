"""A pure-PyTorch GRPO of the learning runs' toy model and task, over many seeds in seconds each: how the
recipe's settings were chosen (docs/e2e.md, "Choosing the task"; issue 34).

A real learning run takes 5-7 minutes on a 2-core machine, too long to compare settings over enough
seeds to see a 1-in-4 failure. This loop keeps what decides learning and drops the machinery: the same
model (``python -m npu_rl.models toy``), tokenizer, data files (``python -m npu_rl.data toy``) and reward
(:func:`npu_rl.toy.compute_score`), one-token answers sampled from the model's last-position
distribution (what vLLM samples with ``max_response_length=1``), verl's own advantage
(``core_algos.compute_grpo_outcome_advantage``), PPO loss (``compute_policy_loss_vanilla``, dual clip
included), entropy and KL terms (``entropy_from_logits``, ``kl_penalty``), AdamW with verl's defaults
(betas 0.9/0.999, weight decay 0.01, gradient clip 1.0), mini-batches of whole groups in the batch's
order, and greedy validation on the unseen validation prompts, every ``--test-freq`` steps and at the end.
It leaves out what cannot change the gradient of a one-token answer: FSDP, the weight sync, vLLM.

Use it to compare settings, not to predict a run: on this machine the real runs learned faster than this
loop (validation 0.46-0.75 at step 5 with groups of 16, where it reaches 0.1-0.34), so a setting
must win here by a margin, over the same seeds, and then in real runs.

    .venv/bin/python benchmarks/toy_grpo_sim.py --seeds 16 --steps 16 --n 32 --entropy-coeff 0.02
    .venv/bin/python benchmarks/toy_grpo_sim.py --seeds 16 --steps 20 --n 16      # the recipe before

Prints one line per seed (validation scores, entropy first -> last, the wrong digits' classes at the end)
and a summary: runs whose last validation is >= --target, the worst and the mean.
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from npu_rl import toy  # noqa: E402

TINY = Path(os.environ.get("NPU_RL_TINY_DIR", Path.home() / ".cache/npu-rl-recipes/qwen3-tiny"))


def encode(tok, rows: list[dict]) -> tuple[torch.Tensor, list[str]]:
    """Prompts through the tokenizer's chat template -> (ids ``[rows, prompt_len]``, answers). Every
    prompt of the task has the same length, so no padding (ValueError when one does not)."""
    text = [tok.apply_chat_template(list(r["prompt"]), add_generation_prompt=True, tokenize=False) for r in rows]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in text]
    if len({len(x) for x in ids}) != 1:
        raise ValueError("prompts of different lengths: not the toy task's data (npu_rl.data toy)")
    return torch.tensor(ids), [r["reward_model"]["ground_truth"] for r in rows]


def run(args: argparse.Namespace, seed: int) -> dict:
    """One GRPO run with sampling and data-order ``seed``; returns validation scores, entropies, wrong classes."""
    import pandas as pd
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl.trainer.ppo import core_algos
    from verl.utils.torch_functional import entropy_from_logits

    torch.manual_seed(1000 + seed)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="sdpa")
    ref = copy.deepcopy(model).eval() if args.kl_coeff else None
    train = pd.read_parquet(args.data / "train.parquet").to_dict("records")
    val = pd.read_parquet(args.data / "val.parquet").to_dict("records")
    train_x, train_y = encode(tok, train)
    val_x, val_y = encode(tok, val)
    words = tok.convert_ids_to_tokens(list(range(model.config.vocab_size)))
    gen, order_rng = torch.Generator().manual_seed(seed), random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), weight_decay=0.01)
    loss_cfg = OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": args.clip_high,
            "clip_ratio_c": 3.0,
            "global_batch_info": {},
        }
    )

    def validate() -> float:
        with torch.no_grad():
            pred = model(val_x).logits[:, -1].argmax(-1).tolist()
        return sum(words[p] == y for p, y in zip(pred, val_y, strict=True)) / len(val_y)

    def last_logits(x: torch.Tensor, net=model) -> torch.Tensor:
        return net(x).logits[:, -1] / args.temperature

    vals, entropies, order = [validate()], [], []
    for step in range(1, args.steps + 1):
        if len(order) < args.prompts:  # a new epoch (drop_last, as verl's dataloader)
            order = list(range(len(train)))
            order_rng.shuffle(order)
        idx = [order.pop() for _ in range(args.prompts)]
        x, y = train_x[idx], [train_y[i] for i in idx]
        with torch.no_grad():
            logits = last_logits(x)
            samples = torch.multinomial(F.softmax(logits, -1), args.n, replacement=True, generator=gen)  # [P, n]
            old_lp = torch.log_softmax(logits, -1).gather(1, samples)
        entropies.append(float(entropy_from_logits(logits).mean()))
        scores = [
            toy.compute_score(toy.DATA_SOURCE, words[t], y[p]) for p in range(args.prompts) for t in samples[p].tolist()
        ]
        adv, _ = core_algos.compute_grpo_outcome_advantage(
            torch.tensor(scores).unsqueeze(1), torch.ones(len(scores), 1), np.repeat(np.arange(args.prompts), args.n)
        )
        adv = adv.view(args.prompts, args.n)
        per_mb = args.prompts // args.mini_batches
        for k in range(args.mini_batches):
            mb = slice(k * per_mb, (k + 1) * per_mb)
            logits = last_logits(x[mb])
            lp = torch.log_softmax(logits, -1).gather(1, samples[mb])
            mask = torch.ones_like(lp)
            loss, _ = core_algos.compute_policy_loss_vanilla(old_lp[mb], lp, adv[mb], mask, "token-mean", loss_cfg)
            if args.entropy_coeff:
                loss = loss - args.entropy_coeff * entropy_from_logits(logits).mean()
            if ref is not None:
                with torch.no_grad():
                    ref_lp = torch.log_softmax(last_logits(x[mb], ref), -1).gather(1, samples[mb])
                loss = loss + args.kl_coeff * core_algos.kl_penalty(lp, ref_lp, "low_var_kl").mean()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        if step % args.test_freq == 0 or step == args.steps:
            vals.append(validate())
    with torch.no_grad():
        pred = model(val_x).logits[:, -1].argmax(-1).tolist()
    wrong = Counter(f"{y}->{words[p]}" for p, y in zip(pred, val_y, strict=True) if words[p] != y)
    return {"vals": vals, "entropy": entropies, "wrong": wrong}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model",
        type=Path,
        default=TINY / "Qwen3-toy",
        help="python -m npu_rl.models toy DEST (default: the recipe's)",
    )
    p.add_argument(
        "--data",
        type=Path,
        default=TINY / "toy-data/toy",
        help="folder of train.parquet and val.parquet (default: the recipe's)",
    )
    p.add_argument("--seeds", type=int, default=8, help="runs: seeds of sampling and data order")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--test-freq", type=int, default=5, help="validate every this many steps, and at the end")
    p.add_argument("--prompts", type=int, default=32, help="prompts per step (data.train_batch_size)")
    p.add_argument("--n", type=int, default=32, help="responses per prompt (rollout.n)")
    p.add_argument(
        "--mini-batches", type=int, default=4, help="optimizer steps per step (prompts / ppo_mini_batch_size)"
    )
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--entropy-coeff", type=float, default=0.02)
    p.add_argument("--kl-coeff", type=float, default=0.0, help="low_var_kl loss against the initial model")
    p.add_argument("--clip-high", type=float, default=0.2)
    p.add_argument("--temperature", type=float, default=1.0, help="rollout temperature (the loss uses it too, as verl)")
    p.add_argument("--target", type=float, default=0.9)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: run two at once on 2 cores)")
    args = p.parse_args(argv)
    for path in (args.model / "config.json", args.data / "train.parquet"):
        if not path.is_file():
            p.error(
                f"{path} is missing: the learning recipe makes it on its first run "
                "(python -m npu_rl.models toy, python -m npu_rl.data toy)"
            )
    if args.prompts % args.mini_batches:
        p.error(f"--prompts {args.prompts} is not a multiple of --mini-batches {args.mini_batches}")
    torch.set_num_threads(args.threads)
    finals = []
    for seed in range(args.seeds):
        r = run(args, seed)
        finals.append(r["vals"][-1])
        print(
            f"seed {seed:2d}  validation {' '.join(f'{v:.2f}' for v in r['vals'])}  "
            f"entropy {r['entropy'][0]:.2f} -> {r['entropy'][-1]:.2f}  wrong {dict(r['wrong'].most_common(4))}",
            flush=True,
        )
    hit = sum(f >= args.target for f in finals)
    mean = sum(finals) / len(finals)
    print(f"runs >= {args.target}: {hit}/{len(finals)}; last validation min {min(finals):.3f} mean {mean:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
