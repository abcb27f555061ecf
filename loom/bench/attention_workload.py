"""What `loom bench attention` times, apart from the timing: one rank's attention shape
from a model config, a step's requests (decodes, prompt chunks) with the bytes and FLOPs its
floor counts, random inputs over a shuffled paged cache, and the float32 torch reference
every kernel output is checked against."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REFERENCE_BYTES = 1 << 30
"""About the most float32 keys, values and scores the reference holds at once."""


# -- shapes ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttentionShape:
    """One rank's attention: query heads, KV heads and head dim."""

    num_heads: int
    num_kv_heads: int
    head_dim: int


def attention_shape(model: str, tp: int) -> AttentionShape:
    from loom.bench.moe_space import model_config_json
    hf = model_config_json(model)
    hf = hf if "num_attention_heads" in hf else hf.get("text_config", hf)
    heads = hf.get("num_attention_heads")
    if not heads:
        raise ValueError(f"model: {model} has no num_attention_heads")
    kv_heads = hf.get("num_key_value_heads") or heads
    head_dim = hf.get("head_dim") or (hf.get("hidden_size") or 0) // heads
    if not head_dim:
        raise ValueError(f"model: {model} has neither head_dim nor hidden_size")
    if tp < 1 or heads % tp:
        raise ValueError(f"tensor_parallel_size: {tp} does not divide {heads} attention heads")
    shape = AttentionShape(heads // tp, max(1, kv_heads // tp), int(head_dim))
    if shape.num_heads % shape.num_kv_heads:
        raise ValueError(f"tensor_parallel_size: {tp} leaves {shape.num_heads} query heads "
                         f"over {shape.num_kv_heads} KV heads")
    return shape


@dataclass(frozen=True)
class Step:
    """One step's requests: query tokens and sequence length (cached + query) of each."""

    query_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)


def decode_step(batch_size: int, context_len: int) -> Step:
    return Step((1,) * batch_size, (context_len,) * batch_size)


def verify_step(batch_size: int, context_len: int, query_len: int) -> Step:
    """A speculative verify step: each request's query_len tokens (1 + k) after context_len
    cached ones."""
    return Step((query_len,) * batch_size, (context_len + query_len,) * batch_size)


def mixed_step(batch_size: int, context_len: int, prompt_tokens: int, chunk_len: int,
               chunk_context: int) -> Step:
    """The decodes first, then the prompt chunks (as the scheduler orders a step)."""
    chunks = [chunk_len] * (prompt_tokens // chunk_len)
    if prompt_tokens % chunk_len:
        chunks.append(prompt_tokens % chunk_len)
    decode = decode_step(batch_size, context_len)
    return Step(decode.query_lens + tuple(chunks),
                decode.seq_lens + tuple(chunk_context + n for n in chunks))


def step_bytes(step: Step, shape: AttentionShape, elem_size: int,
               kv_elem_size: int | None = None) -> int:
    """Every request's keys and values once (kv_elem_size bytes each; None: elem_size), the
    queries and the outputs."""
    kv = sum(step.seq_lens) * 2 * shape.num_kv_heads * shape.head_dim
    q_out = 2 * step.num_tokens * shape.num_heads * shape.head_dim
    return kv * (kv_elem_size or elem_size) + q_out * elem_size


def step_flops(step: Step, shape: AttentionShape) -> int:
    """The prompt chunks' causal attention: QK^T and PV, 2 x head_dim FLOPs each per visible
    (query, key) pair; the decodes' are left out (reading their keys is what costs)."""
    pairs = 0
    for q, s in zip(step.query_lens, step.seq_lens):
        if q > 1:
            pairs += q * (s - q) + q * (q + 1) // 2
    return 4 * shape.num_heads * shape.head_dim * pairs


# -- inputs and the reference ------------------------------------------------------------------
@dataclass
class Inputs:
    query: Any
    kv_cache: Any
    meta: Any
    """loom.attention.backend.AttentionMetadata of the step."""
    scale: float


def make_inputs(step: Step, shape: AttentionShape, block_size: int, dtype, device,
                seed: int, cache_dtype=None) -> Inputs:
    """cache_dtype: the KV cache's (None: dtype); an 8-bit cache holds the random values
    converted."""
    import torch

    from loom.attention.backend import AttentionMetadata
    gen = torch.Generator(device=device).manual_seed(seed)
    blocks = [-(-s // block_size) for s in step.seq_lens]
    # Exactly the blocks needed, handed out in a shuffled order.
    order = torch.randperm(sum(blocks), generator=torch.Generator().manual_seed(seed))
    table = torch.zeros(len(blocks), max(blocks), dtype=torch.int32)
    for i, row in enumerate(torch.split(order, blocks)):
        table[i, :len(row)] = row
    cache = torch.randn(2, sum(blocks), block_size, shape.num_kv_heads, shape.head_dim,
                        generator=gen, device=device, dtype=dtype).to(cache_dtype or dtype)
    query = torch.randn(step.num_tokens, shape.num_heads, shape.head_dim, generator=gen,
                        device=device, dtype=dtype)
    starts = torch.tensor((0,) + step.query_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    seq_lens = torch.tensor(step.seq_lens, dtype=torch.int32)
    meta = AttentionMetadata(
        num_actual_tokens=step.num_tokens, num_reqs=len(blocks),
        max_query_len=max(step.query_lens), max_seq_len=max(step.seq_lens),
        query_start_loc=starts.to(device), seq_lens=seq_lens.to(device),
        block_table=table.to(device),
        slot_mapping=torch.full((step.num_tokens,), -1, dtype=torch.int64, device=device),
        query_start_loc_cpu=starts, seq_lens_cpu=seq_lens)
    return Inputs(query, cache, meta, shape.head_dim ** -0.5)


def reference(inputs: Inputs, step: Step):
    """float32 [tokens, heads, head_dim]: each request's keys and values gathered through
    its block table, causal softmax attention; requests of one (query, sequence) length
    at a time, in groups of bounded size."""
    import torch
    q_all, cache, meta = inputs.query, inputs.kv_cache, inputs.meta
    _, heads, dim = q_all.shape
    block_size, kv_heads = cache.shape[2], cache.shape[3]
    group = heads // kv_heads
    out = torch.empty(q_all.shape, dtype=torch.float32, device=q_all.device)
    starts = meta.query_start_loc_cpu.tolist()
    by_len: dict[tuple[int, int], list[int]] = {}
    for i, key in enumerate(zip(step.query_lens, step.seq_lens)):
        by_len.setdefault(key, []).append(i)
    for (q_len, s_len), reqs in by_len.items():
        per_req = 4 * (2 * s_len * kv_heads * dim + q_len * s_len * heads)
        at_once = max(1, REFERENCE_BYTES // per_req)
        n_blocks = -(-s_len // block_size)
        visible = (torch.arange(s_len, device=q_all.device)[None, :]
                   <= (s_len - q_len + torch.arange(q_len, device=q_all.device))[:, None])
        for lo in range(0, len(reqs), at_once):
            part = reqs[lo:lo + at_once]
            idx = torch.tensor(part, device=q_all.device)
            table = meta.block_table[idx, :n_blocks].long()
            k, v = (cache[plane][table].flatten(1, 2)[:, :s_len].float() for plane in (0, 1))
            rows = (torch.tensor([starts[i] for i in part], device=q_all.device)[:, None]
                    + torch.arange(q_len, device=q_all.device)[None, :])
            q = q_all[rows].float().view(len(part), q_len, kv_heads, group, dim)
            scores = torch.einsum("bqkgd,bskd->bkgqs", q, k) * inputs.scale
            probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
            o = torch.einsum("bkgqs,bskd->bqkgd", probs, v)
            out[rows] = o.reshape(len(part), q_len, heads, dim)
    return out


def max_rel_error(out, ref) -> float:
    """Worst relative L2 error of one (token, head) row; NaN counts as infinite."""
    import torch
    err = (out.float() - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-6)
    return float(torch.nan_to_num(err, nan=float("inf")).max())
