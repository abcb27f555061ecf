"""Prompts for the serving benchmark: random tokens, sonnet lines, or ShareGPT conversations.

Every prompt is text (so that any OpenAI-compatible server, chat or completions, can take it),
and its `prompt_len` is what the benchmark's tokenizer counts when it re-encodes that text
(no special tokens; a server that adds BOS reports one more).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from loom.frontend.tokenizer import Tokenizer

DATASETS = ("random", "sonnet", "sharegpt")
SONNET_INSTRUCTION = "Pick as many lines as you can from these poem lines:\n"
_ADJUST_ROUNDS = 8


@dataclass(frozen=True)
class SampleRequest:
    prompt: str
    prompt_len: int
    expected_output_len: int


@dataclass(frozen=True)
class DatasetConfig:
    name: str
    path: str | None
    num_prompts: int
    seed: int = 0
    random_input_len: int = 1024
    random_output_len: int = 128
    random_prefix_len: int = 0
    random_range_ratio: float = 0.0
    """Each random prompt's and output's length drawn uniformly from len * (1 -+ ratio)."""
    sonnet_input_len: int = 550
    sonnet_output_len: int = 150
    sonnet_prefix_len: int = 200
    sharegpt_output_len: int | None = None
    """None: each conversation's own reply length."""

    def __post_init__(self) -> None:
        if self.name not in DATASETS:
            raise ValueError(f"dataset_name: {self.name!r} is not one of {DATASETS}")
        if self.name != "random" and not self.path:
            raise ValueError(f"dataset_path: the {self.name} dataset reads a file; pass --dataset-path")
        if self.num_prompts < 1:
            raise ValueError(f"num_prompts: must be at least 1, got {self.num_prompts}")
        for name in ("random_input_len", "random_output_len", "sonnet_input_len",
                     "sonnet_output_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be at least 1, got {getattr(self, name)}")
        if self.random_prefix_len < 0 or self.sonnet_prefix_len < 0:
            raise ValueError("prefix lengths must be non-negative")
        if not 0 <= self.random_range_ratio < 1:
            raise ValueError(f"random_range_ratio: must be in [0, 1), got "
                             f"{self.random_range_ratio}")


def add_dataset_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("dataset")
    g.add_argument("--dataset-name", default="random", choices=DATASETS)
    g.add_argument("--dataset-path", default=None, help="sonnet text file or ShareGPT JSON")
    g.add_argument("--random-input-len", type=int, default=1024)
    g.add_argument("--random-output-len", type=int, default=128)
    g.add_argument("--random-prefix-len", type=int, default=0,
                   help="random tokens shared by every prompt, before its own --random-input-len")
    g.add_argument("--random-range-ratio", type=float, default=0.0,
                   help="each prompt's and output's length drawn uniformly from "
                        "len * (1 - ratio) .. len * (1 + ratio), as vLLM's (0: fixed)")
    g.add_argument("--sonnet-input-len", type=int, default=550)
    g.add_argument("--sonnet-output-len", type=int, default=150)
    g.add_argument("--sonnet-prefix-len", type=int, default=200)
    g.add_argument("--sharegpt-output-len", type=int, default=None)


def dataset_config(ns: argparse.Namespace, num_prompts: int, seed: int) -> DatasetConfig:
    return DatasetConfig(
        name=ns.dataset_name, path=ns.dataset_path, num_prompts=num_prompts, seed=seed,
        random_input_len=ns.random_input_len, random_output_len=ns.random_output_len,
        random_prefix_len=ns.random_prefix_len, random_range_ratio=ns.random_range_ratio,
        sonnet_input_len=ns.sonnet_input_len,
        sonnet_output_len=ns.sonnet_output_len, sonnet_prefix_len=ns.sonnet_prefix_len,
        sharegpt_output_len=ns.sharegpt_output_len)


def sample_requests(cfg: DatasetConfig, tokenizer: Tokenizer) -> list[SampleRequest]:
    rng = np.random.default_rng(cfg.seed)
    if cfg.name == "random":
        return random_requests(cfg, tokenizer, rng)
    if cfg.name == "sonnet":
        return sonnet_requests(cfg, tokenizer, rng)
    return sharegpt_requests(cfg, tokenizer, rng)


def count_tokens(tokenizer: Tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


# -- random ------------------------------------------------------------------------------------
def text_of_length(tokenizer: Tokenizer, rng: np.random.Generator, target: int) -> str:
    """Text of random tokens that re-encodes to `target` tokens (within a token or two: BPE may
    merge across a cut). Decoding random ids and encoding the text back changes the count, so
    the ids are cut or topped up and tried again."""
    vocab = tokenizer.vocab_size
    ids = rng.integers(0, vocab, size=target).tolist()
    text = tokenizer.decode(ids)
    for _ in range(_ADJUST_ROUNDS):
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) == target:
            break
        ids = ids[:target] + rng.integers(0, vocab, size=max(0, target - len(ids))).tolist()
        text = tokenizer.decode(ids)
    return text


def random_requests(cfg: DatasetConfig, tokenizer: Tokenizer,
                    rng: np.random.Generator) -> list[SampleRequest]:
    prefix = text_of_length(tokenizer, rng, cfg.random_prefix_len) if cfg.random_prefix_len else ""
    inputs = draw_lengths(rng, cfg.random_input_len, cfg.random_range_ratio, cfg.num_prompts)
    outputs = draw_lengths(rng, cfg.random_output_len, cfg.random_range_ratio, cfg.num_prompts)
    out = []
    for n_in, n_out in tqdm(zip(inputs, outputs), total=cfg.num_prompts,
                            desc="Building random prompts", leave=False, disable=None):
        prompt = prefix + text_of_length(tokenizer, rng, n_in)
        out.append(SampleRequest(prompt, count_tokens(tokenizer, prompt), n_out))
    return out


def draw_lengths(rng: np.random.Generator, length: int, ratio: float, count: int) -> list[int]:
    """count lengths drawn uniformly from the integers in [length * (1 - ratio),
    length * (1 + ratio)] (at least 1); all `length` for ratio 0. Also `loom bench
    throughput`'s."""
    if ratio == 0:
        return [length] * count
    low, high = length_bounds(length, ratio)
    return rng.integers(low, high + 1, size=count).tolist()


def length_bounds(length: int, ratio: float) -> tuple[int, int]:
    """The shortest and longest length `draw_lengths` draws."""
    return max(1, int(length * (1 - ratio))), max(1, int(length * (1 + ratio)))


# -- sonnet ------------------------------------------------------------------------------------
def sonnet_requests(cfg: DatasetConfig, tokenizer: Tokenizer,
                    rng: np.random.Generator) -> list[SampleRequest]:
    """A fixed shared prefix (the instruction and the file's first lines, about
    --sonnet-prefix-len tokens), then random lines until --sonnet-input-len tokens."""
    lines = _read_lines(cfg.path)
    if cfg.sonnet_input_len <= cfg.sonnet_prefix_len:
        raise ValueError(f"sonnet_input_len ({cfg.sonnet_input_len}) must exceed "
                         f"sonnet_prefix_len ({cfg.sonnet_prefix_len})")
    prefix = _sonnet_prefix(lines, tokenizer, cfg.sonnet_prefix_len)
    lengths = [count_tokens(tokenizer, line) for line in lines]
    out = []
    for _ in tqdm(range(cfg.num_prompts), desc="Building sonnet prompts", leave=False, disable=None):
        prompt = _fill_lines(prefix, lines, lengths, tokenizer, rng, cfg.sonnet_input_len)
        out.append(SampleRequest(prompt, count_tokens(tokenizer, prompt), cfg.sonnet_output_len))
    return out


def _read_lines(path: str | None) -> list[str]:
    file = Path(str(path))
    if not file.is_file():
        raise ValueError(f"dataset_path: {path} is not a file")
    lines = [line.rstrip() + "\n" for line in file.read_text(encoding="utf-8").splitlines()
             if line.strip()]
    if not lines:
        raise ValueError(f"dataset_path: {path} has no non-empty lines")
    return lines


def _sonnet_prefix(lines: list[str], tokenizer: Tokenizer, prefix_len: int) -> str:
    prefix = SONNET_INSTRUCTION
    for line in lines:
        if count_tokens(tokenizer, prefix) >= prefix_len:
            return prefix
        prefix += line
    if count_tokens(tokenizer, prefix) < prefix_len:
        raise ValueError(f"sonnet_prefix_len: the whole file is shorter than {prefix_len} tokens")
    return prefix


def _fill_lines(prefix: str, lines: list[str], lengths: list[int], tokenizer: Tokenizer,
                rng: np.random.Generator, target: int) -> str:
    parts, total = [prefix], count_tokens(tokenizer, prefix)
    while total < target:
        i = int(rng.integers(len(lines)))
        parts.append(lines[i])
        total += lengths[i]
    ids = tokenizer.encode("".join(parts), add_special_tokens=False)[:target]
    return tokenizer.decode(ids)


# -- ShareGPT ----------------------------------------------------------------------------------
def sharegpt_requests(cfg: DatasetConfig, tokenizer: Tokenizer,
                      rng: np.random.Generator) -> list[SampleRequest]:
    """The first human turn is the prompt; the reply's length (or --sharegpt-output-len) is the
    output length. Conversations with a prompt or reply under 4 tokens, a prompt over 1024 or
    both over 2048 tokens are skipped, as vLLM's benchmark does."""
    pairs = _sharegpt_pairs(cfg.path)
    out: list[SampleRequest] = []
    for i in rng.permutation(len(pairs)):
        prompt, reply = pairs[int(i)]
        prompt_len = count_tokens(tokenizer, prompt)
        output_len = cfg.sharegpt_output_len or count_tokens(tokenizer, reply)
        if prompt_len < 4 or output_len < 4 or prompt_len > 1024 or prompt_len + output_len > 2048:
            continue
        out.append(SampleRequest(prompt, prompt_len, output_len))
        if len(out) == cfg.num_prompts:
            return out
    raise ValueError(f"dataset_path: {cfg.path} has only {len(out)} usable conversations, fewer "
                     f"than --num-prompts {cfg.num_prompts}")


def _sharegpt_pairs(path: str | None) -> list[tuple[str, str]]:
    try:
        data = json.loads(Path(str(path)).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"dataset_path: cannot read ShareGPT JSON from {path}: {e}") from e
    if not isinstance(data, list):
        raise ValueError(f"dataset_path: {path} is not a JSON list of conversations")
    pairs = []
    for entry in data:
        turns = entry.get("conversations") or entry.get("conversation") or []
        if len(turns) >= 2 and all(isinstance(t, dict) and "value" in t for t in turns[:2]):
            pairs.append((str(turns[0]["value"]), str(turns[1]["value"])))
    return pairs
