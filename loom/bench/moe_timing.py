"""`loom bench moe`'s timing half: one model shape's experts on one GPU (bf16, fp8, or
packed int4 / int8 drawn at random), fresh inputs per batch size, a call timed as CUDA
graph replays (`KernelTimer`) and checked against moe_reference."""

from __future__ import annotations

from typing import Any

from loom.bench.kernel_timing import KernelTimer, nan_fresh_tensors
from loom.bench.moe_space import MoeShape, search_space

INT4_GROUP = 128
"""`--weight-dtype int4`'s (and int8's) group size: AWQ's and GPTQ's usual one."""
INTEGER_BITS = {"int4": 4, "int8": 8}
"""`--weight-dtype`s of packed integer experts, and their bits."""


class Bench:
    """One model shape on one GPU: weights drawn once, inputs fresh per batch size."""

    def __init__(self, shape: MoeShape, dtype, seed: int, warmup: int, iters: int,
                 weight_dtype: str = "auto") -> None:
        import torch
        self.torch = torch
        self.shape, self.dtype = shape, dtype
        self.device = torch.device("cuda", torch.cuda.current_device())
        gen = torch.Generator(device=self.device).manual_seed(seed)
        e, h, n = shape.num_experts, shape.hidden, shape.inter
        self.w13 = (torch.randn(e, 2 * n, h, device=self.device, generator=gen)
                    * h ** -0.5).to(dtype)
        self.w2 = (torch.randn(e, h, n, device=self.device, generator=gen) * n ** -0.5).to(dtype)
        self.quant: dict[str, Any] = {}
        """fused_moe's fp8 arguments (scales, block) when the experts are fp8, int4 / int8
        ones (scales, zero points, group size, bits) when they are packed integers."""
        self.bits = INTEGER_BITS.get(weight_dtype, 4)
        """The packed integer experts' width (4 unless --weight-dtype int8)."""
        self.bytes_per_weight: float = self.w13.element_size()
        """What the GB/s column counts per weight (int4: half a byte, int8: one, and its
        group's share of a scale and a zero point)."""
        if weight_dtype in INTEGER_BITS:
            self._to_int4(gen)
        elif weight_dtype != "auto":
            self._to_fp8(weight_dtype == "fp8-block")
            self.bytes_per_weight = 1
        self.timer = KernelTimer(self.device, warmup, iters)
        self.seed = seed
        self.inputs: tuple | None = None
        self.num_tokens = 0
        self.experts_touched = 0
        self._reference = None

    def _to_fp8(self, blocks: bool) -> None:
        """The experts quantized as loom loads fp8 ones: per output row, or 128x128 blocks."""
        from loom.quantization.fp8 import quantize_rows
        from loom.quantization.fp8_block import quantize_blocks
        scaled = {}
        for name in ("w13", "w2"):
            w = getattr(self, name)
            pairs = [quantize_blocks(x, (128, 128)) if blocks else quantize_rows(x) for x in w]
            values, scales = (self.torch.stack(t) for t in zip(*pairs))
            setattr(self, name, values)
            scaled[name + "_scale"] = scales
        self.quant = {**scaled, "weight_block": (128, 128) if blocks else None}

    def _to_int4(self, gen) -> None:
        """Random int4 (int8: 8-bit) experts in place of the drawn ones (the values are not
        timed)."""
        e, h, n = self.shape.num_experts, self.shape.hidden, self.shape.inter
        bits = self.bits
        self.w13, s13, z13 = random_int4_experts(e, 2 * n, h, self.dtype, gen, bits=bits)
        self.w2, s2, z2 = random_int4_experts(e, h, n, self.dtype, gen, bits=bits)
        self.quant = {"w13_scale": s13, "w2_scale": s2, "w13_zero": z13, "w2_zero": z2,
                      "group_size": INT4_GROUP, "bits": bits}
        self.bytes_per_weight = bits / 8 + (s13.element_size() + 1) / INT4_GROUP

    def search_space(self, num_tokens: int) -> list[dict[str, int]]:
        """The first pass's configs; for packed integer experts without the grouped-GEMM
        tiles whose BLOCK_K a group caps (they would run as the capped ones: timed twice)."""
        space = search_space(self.shape, num_tokens, self.bytes_per_weight)
        if "group_size" not in self.quant:
            return space
        step = self.quant["group_size"] & -self.quant["group_size"]
        return [c for c in space if c["GEMV"] or c["BLOCK_K"] <= step]

    def set_batch(self, num_tokens: int) -> None:
        torch = self.torch
        gen = torch.Generator(device=self.device).manual_seed(self.seed * 1_000_003 + num_tokens)
        x = (torch.randn(num_tokens, self.shape.hidden, device=self.device, generator=gen)
             * 0.1).to(self.dtype)
        logits = torch.randn(num_tokens, self.shape.num_experts, device=self.device,
                             generator=gen)
        weights, ids = torch.softmax(logits, dim=-1).topk(self.shape.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        self.inputs = (x, self.w13, self.w2, weights, ids)
        self.num_tokens = num_tokens
        self.experts_touched = int(ids.unique().numel())
        self._reference = None
        torch.cuda.empty_cache()
        self.timer.spin()

    def call(self, config: dict[str, int]):
        from loom.kernels.fused_moe import fused_moe
        return fused_moe(*self.inputs, **self.quant, config=config)

    def time_us(self, config: dict[str, int], iters: int | None = None,
                budget_s: float | None = None) -> float:
        """Median us of one call replayed from a CUDA graph (KernelTimer). With budget_s,
        as many replays as fit in it (at least 3, at most iters): the search's first pass
        at large M."""
        return self.timer.time_us(lambda: self.call(config), iters, budget_s)

    def check(self, config: dict[str, int]) -> float:
        """Worst per-token relative error against moe_reference, every scratch buffer
        pre-filled with NaN so rows the kernels skip cannot pass on stale memory."""
        from loom.kernels.fused_moe import moe_reference
        torch = self.torch
        if self._reference is None:
            self._reference = moe_reference(*self.inputs, **self.quant).float()
        with nan_fresh_tensors():
            out = self.call(config).float()
        ref = self._reference
        err = (out - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-6)
        return float(torch.nan_to_num(err, nan=float("inf")).max())


def random_int4_experts(experts: int, rows: int, cols: int, dtype, generator,
                        group: int = INT4_GROUP, bits: int = 4) -> tuple:
    """Stacked int4 (bits=8: 8-bit) experts [E, rows, cols] as fused_moe takes them, on
    the generator's device: packed words drawn uniformly (values 0 .. 2^bits - 1), zero
    points within 2 (8 bits: 32) of the middle 2^(bits - 1) and scales about
    1 / (spread * sqrt(cols)) (a value less its zero point has a spread of
    sqrt((4^bits - 1) / 12): 4.6, or 74), so that a row's product with O(1) activations
    stays O(1)."""
    import torch
    device = generator.device
    words = torch.randint(-2 ** 31, 2 ** 31, (experts, rows, cols * bits // 32),
                          dtype=torch.int32, device=device, generator=generator)
    groups = (experts, rows, cols // group)
    spread = ((4 ** bits - 1) / 12) ** 0.5
    scale = ((torch.rand(groups, device=device, generator=generator) + 0.5)
             / (spread * cols ** 0.5)).to(dtype)
    mid, reach = 1 << (bits - 1), 1 << (bits - 3)
    zero = torch.randint(mid - reach, mid + reach + 1, groups, dtype=torch.uint8,
                         device=device, generator=generator)
    return words, scale, zero


# A winner's per-token error against the fp32 reference must stay under this: bf16
# rounding of the SwiGLU product and of each slot's row gives well under 1%, while a
# wrong or missing slot gives tens of percent.
MAX_REL_ERROR = {"bfloat16": 3e-2, "float16": 1e-2}
