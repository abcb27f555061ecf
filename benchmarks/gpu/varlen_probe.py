"""Fresh prompt chunks (no cached context) the way throughput's prompt steps hold them:
--chunks requests of --chunk-len tokens, Llama-3.1-8B heads (32 query, 8 KV, head dim 128),
bf16. Times loom's varlen paged kernel against PyTorch's flash varlen attention
(torch.nn.attention.varlen, where this PyTorch has it) and against SDPA once per request;
each output is checked against the paged kernel's. Prints TFLOP/s of causal attention
against the bf16 matmul ceiling measured here. A probe for choosing a prompt-chunk path, not
a test."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json

import torch
import torch.nn.functional as F

from loom.bench.ceilings import measure_ceilings
from loom.bench.kernel_timing import KernelTimer
from loom.kernels.paged_attention import paged_prefill


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--chunks", type=int, default=16)
    p.add_argument("--chunk-len", type=int, default=1024)
    p.add_argument("--output-json", default=None)
    args = p.parse_args()
    dev = torch.device("cuda")
    ceil = measure_ceilings(dev)
    h, hkv, d, bs = 32, 8, 128, 16
    n, L = args.chunks, args.chunk_len
    T = n * L
    q = torch.randn(T, h, d, device=dev, dtype=torch.bfloat16)
    k = torch.randn(T, hkv, d, device=dev, dtype=torch.bfloat16)
    v = torch.randn(T, hkv, d, device=dev, dtype=torch.bfloat16)
    blocks = L // bs
    perm = torch.randperm(n * blocks, device=dev).int()
    table = perm.view(n, blocks)
    cache = torch.empty(2, n * blocks, bs, hkv, d, device=dev, dtype=torch.bfloat16)
    for i in range(n):  # request i's tokens into its blocks
        rows = table[i].long()
        cache[0, rows] = k[i * L:(i + 1) * L].view(blocks, bs, hkv, d)
        cache[1, rows] = v[i * L:(i + 1) * L].view(blocks, bs, hkv, d)
    cu = torch.arange(0, T + 1, L, device=dev, dtype=torch.int32)
    seq = torch.full((n,), L, device=dev, dtype=torch.int32)
    scale = d ** -0.5
    flops = 4 * h * d * n * L * (L + 1) / 2
    timer = KernelTimer(dev, 3, 20, fall_back_to_launches=True)
    timer.spin()
    results = {}

    out_paged = torch.empty_like(q)

    def paged():
        return paged_prefill(q, cache, out_paged, table, cu, seq, n, L, scale, block_m=128,
                             block_n=64, num_warps=8)
    ref = paged().float()
    results["paged_prefill"] = timer.time_us(paged)

    def sdpa_loop():
        out = torch.empty_like(q)
        for i in range(n):
            s = slice(i * L, (i + 1) * L)
            out[s] = F.scaled_dot_product_attention(
                q[s].transpose(0, 1)[None], k[s].transpose(0, 1)[None],
                v[s].transpose(0, 1)[None], is_causal=True, scale=scale,
                enable_gqa=True)[0].transpose(0, 1)
        return out
    err = {"sdpa_per_request": float((sdpa_loop().float() - ref).abs().max())}
    results["sdpa_per_request"] = timer.time_us(sdpa_loop)
    try:
        from torch.nn.attention.varlen import varlen_attn
        params = inspect.signature(varlen_attn).parameters
        gqa = "enable_gqa" in params
        kk, vv = (k, v) if gqa else (k.repeat_interleave(h // hkv, 1),
                                     v.repeat_interleave(h // hkv, 1))
        kw = {"enable_gqa": True} if gqa else {}
        if "is_causal" in params:
            kw["is_causal"] = True
        else:
            kw["window_size"] = (-1, 0)
        if "scale" in params:
            kw["scale"] = scale

        def varlen():
            return varlen_attn(q, kk, vv, cu, cu, L, L, **kw)
        err["varlen_attn"] = float((varlen().float() - ref).abs().max())
        results["varlen_attn"] = timer.time_us(varlen)
        results["varlen_attn_args"] = sorted(params)
        results["varlen_gqa_native"] = gqa
    except Exception as e:  # noqa: BLE001 - absent in this PyTorch, or refused
        results["varlen_attn_error"] = f"{type(e).__name__}: {e}"[:300]
    print(f"{n} chunks x {L} tokens, {flops / 1e12:.2f} TFLOP; matmul ceiling "
          f"{ceil.matmul_tflop_per_s:.0f} TFLOP/s; max abs diff vs paged: {err}")
    for name, us in results.items():
        if isinstance(us, float):
            tf = flops / us / 1e6
            print(f"  {name:>18}: {us:9.1f} us  {tf:6.0f} TFLOP/s  "
                  f"{tf / ceil.matmul_tflop_per_s:.1%} of the ceiling")
        else:
            print(f"  {name}: {us}")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"chunks": n, "chunk_len": L, "flops": flops,
                       "ceilings": dataclasses.asdict(ceil), "us": results, "max_abs_diff": err,
                       "torch": torch.__version__}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
