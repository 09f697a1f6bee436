"""A task and a model small enough that a CPU run learns it in minutes: the learning runs' world (issue 34).

**The tokenizer**: a word-level vocabulary built with the ``tokenizers`` library, saved in the
Hugging Face format (``tokenizer.json``, ``tokenizer_config.json`` with a Qwen-style chat template)
that verl and vLLM load with ``AutoTokenizer``: the special tokens of Qwen3's chat format
(``<|endoftext|>`` pads, ``<|im_start|>``, ``<|im_end|>`` ends a turn), ``<unk>``, the newline, the
two role words, the ten digits and the five letters ``a``-``e``: 22 tokens. Spaces separate words; a
newline, each digit and each letter are tokens of their own (verl's handling of Qwen chat turns needs
``"\n"`` to be one token).

**The task** (data source :data:`DATA_SOURCE`): the prompt is :data:`WORDS_PER_PROMPT` words, one
digit among letters at a random place, for example ``c 7 a b``; the answer is the digit (``7``). The
reward (:func:`compute_score`, verl's ``custom_reward_function`` interface) reads the response's first
word: 1.0 for the answer, 0.05 for another digit (partial credit for the format), 0.0 for anything
else. The answer depends on the prompt and on nothing else:

- a policy that spreads its first token evenly over the 22-token vocabulary earns 1/22 + 9/22 x
  0.05 = 0.066; the random model measured 0.08 (tests/test_toy_on_cpu.py). The recipes and CI
  call 0.1 chance: above what the random model earns, below what a non-reading policy can reach;
- a policy that answers digits without reading the prompt earns at most 0.1 + 0.9 x 0.05 = 0.145;
- only a policy that reads the prompt reaches 0.9, and one that learned the task earns 1.0.

Why this task: the gap between what reading buys and what anything else buys is wide, so a score of
0.9 cannot come from format alone or from luck; the answer is one token; and the validation prompts
are ones training never saw (5,000 possible prompts). The digit's place varies, so the model must find
it, but no place is special, so one layer of attention finds it without first learning to count
positions. That made the difference in a pure-PyTorch GRPO of this model and tokenizer with the
recipe's settings (docs/e2e.md, "Choosing the task"): over 24 runs (3 model seeds x 8 data and sampling
seeds) the greedy validation score at step 20 was 0.67-1.0 (mean 0.93); answering the last of four
digits with the 2-layer model used before reached 0.26-0.99 (mean 0.74), its slow runs stuck at
answering digits without reading them.

``python -m npu_rl.models toy DEST`` writes the model, ``python -m npu_rl.data toy --out DIR`` the
data; the learning recipe (``recipes/qwen3-tiny/grpo_learn_cpu.sh``) makes both on first use.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from npu_rl.errors import ModelError

DATA_SOURCE = "npu_rl/toy_find_digit"
WORDS_PER_PROMPT = 4  # one digit and three letters
LETTERS = "abcde"  # the distractors
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
WORDS = ["<unk>", "\n", "user", "assistant", *"0123456789", *LETTERS]
PAD, EOS = "<|endoftext|>", "<|im_end|>"
FORMAT_CREDIT = 0.05  # the reward of a wrong digit: the format is right
# The same template as Qwen3's for plain turns (no tools, no thinking).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def vocabulary() -> dict[str, int]:
    """Token -> id: the special tokens first (ids 0..2), then :data:`WORDS`."""
    return {t: i for i, t in enumerate([*SPECIAL, *WORDS])}


def build_tokenizer():
    """A ``transformers.PreTrainedTokenizerFast`` over :func:`vocabulary` with the chat template.

    Encoding: whitespace splits words, every digit is a token, the special tokens are matched whole;
    a word outside the vocabulary is ``<unk>``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=vocabulary(), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex("\n"), behavior="isolated"),  # verl's Qwen chat handling needs "\n" as one token
            pre_tokenizers.Split(Regex("[ \t\r]+"), behavior="removed"),
            pre_tokenizers.Digits(individual_digits=True),
        ]
    )
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins tokens with one space
    tok.add_special_tokens(SPECIAL)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=PAD, unk_token="<unk>", model_max_length=256
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def answer(prompt: str) -> str:
    """The task's answer for a prompt: its one digit (``"c 7 a b"`` -> ``"7"``).

    Raises:
        ValueError: the prompt has no digit, or more than one (not a prompt of this task).
    """
    found = re.findall(r"\d", prompt)
    if len(found) != 1:
        raise ValueError(f"toy task: the prompt {prompt!r} has {len(found)} digits, not one")
    return found[0]


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info=None, **_) -> float:
    """verl's ``custom_reward_function`` for :data:`DATA_SOURCE`: the response's first word (of
    ``solution_str``, the decoded response without special tokens) scores 1.0 when it is
    ``ground_truth`` (the answer digit), 0.05 when it is another digit, 0.0 otherwise.

    With a ground truth of R words (the repeat variant, :func:`rows` with ``repeat=R``: the digit R
    times) the response's first R words are scored so, each against its word, and the score is
    their mean (1.0 only when all R are the digit; a missing word scores 0).

    Raises:
        ValueError: another data source (the recipe routed another dataset here).
    """
    if data_source != DATA_SOURCE:
        raise ValueError(f"toy reward: data source {data_source!r} is not {DATA_SOURCE!r}")
    truth, words = ground_truth.split(), solution_str.split()
    return sum(_word_score(w, t) for w, t in zip(words, truth, strict=False)) / len(truth)


def _word_score(word: str, truth: str) -> float:
    if word == truth:
        return 1.0
    return FORMAT_CREDIT if len(word) == 1 and word.isdigit() else 0.0


def rows(n: int, split: str, seed: int, repeat: int = 1) -> list[dict]:
    """``n`` verl rows (``RLHFDataset``'s layout, like :func:`npu_rl.data.convert`'s) of the task:
    prompts of one digit among :data:`LETTERS` drawn with ``seed``; ``extra_info.index`` unique per split.
    ``repeat`` R > 1: the answer is the digit R times (``"7 7 7"``), the variant whose converged
    responses repeat, for speculative decoding in a learning loop (the prompts do not change).

    Raises:
        ValueError: ``repeat`` < 1.
    """
    if repeat < 1:
        raise ValueError(f"toy task: repeat must be >= 1 (got {repeat})")
    rng = random.Random(f"{split}:{seed}")
    out = []
    for i in range(n):
        words = [rng.choice(LETTERS) for _ in range(WORDS_PER_PROMPT)]
        words[rng.randrange(WORDS_PER_PROMPT)] = str(rng.randrange(10))
        prompt = " ".join(words)
        out.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": prompt}],
                "ability": "toy",
                "reward_model": {"style": "rule", "ground_truth": " ".join([answer(prompt)] * repeat)},
                "extra_info": {"index": i, "split": split, "dataset": "toy", "question": prompt},
            }
        )
    return out


def write_tokenizer(dest: Path) -> None:
    """Save :func:`build_tokenizer` into ``dest`` (``tokenizer.json``, ``tokenizer_config.json``, ...).

    Raises:
        ModelError: the saved tokenizer has no chat template (verl renders every prompt with it).
    """
    build_tokenizer().save_pretrained(dest)
    cfg = json.loads((Path(dest) / "tokenizer_config.json").read_text())
    if not (cfg.get("chat_template") or (Path(dest) / "chat_template.jinja").is_file()):
        raise ModelError(
            f"{dest}: transformers saved the toy tokenizer without its chat template (neither "
            "tokenizer_config.json's chat_template nor chat_template.jinja): verl could not render a prompt"
        )
