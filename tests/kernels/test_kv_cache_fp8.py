"""An 8-bit KV cache (`kv_cache_dtype="fp8"` / "fp8_e5m2"): the Triton kernels and the
torch backend store keys and values as torch itself converts them (saturated at the
format's largest value), and attend over what the cache holds.

The reference is torch's own float8 conversion and the torch backend in float32 over the
rounded values. On the CPU the kernels run in Triton's interpreter.
"""

import os

import torch

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from loom.attention.torch_native import TorchNativeBackend  # noqa: E402
from loom.attention.triton_backend import TritonBackend, TritonTiles  # noqa: E402
from tests.kernels.test_paged_attention import (  # noqa: E402
    CPU_TILES, DECODE, MIXED, PREFILL, Batch, cpu_only, make_batch, needs_gpu)
from tests.kernels.test_paged_attention_rope import decode_fused_and_unfused  # noqa: E402

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def torch_fp8(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """torch's conversion, saturated (torch gives e5m2 overflow as inf)."""
    limit = torch.finfo(dtype).max
    return x.float().clamp(-limit, limit).to(dtype)


def fp8_batch(case, dtype, scale_kv=1.0, device="cpu", compute=torch.float32) -> Batch:
    q_lens, s_lens, h, hkv, d, bs, pad = case
    b = make_batch(q_lens, s_lens, h, hkv, d, bs, pad=pad, dtype=compute, device=device)
    b.key.mul_(scale_kv)  # views of one QKV tensor: scales the new keys and values in place
    b.value.mul_(scale_kv)
    b.kv_cache = b.kv_cache.to(dtype)  # the cached context, already 8-bit (NaN stays NaN)
    return b


def reference(b: Batch, dtype: torch.dtype, scale: float):
    """The cache after this step's writes (as float32) and the torch backend's output."""
    cache = b.kv_cache.float().clone()
    native = TorchNativeBackend()
    native.write_kv(torch_fp8(b.key, dtype).float(), torch_fp8(b.value, dtype).float(), cache,
                    b.meta.slot_mapping)
    return cache, native.forward(b.query.float(), cache, b.meta, scale)


def check(b: Batch, dtype, backend, atol=1e-4, rtol=1e-4) -> None:
    scale = b.query.shape[-1] ** -0.5
    ref_cache, ref_out = reference(b, dtype, scale)
    backend.write_kv(b.key, b.value, b.kv_cache, b.meta.slot_mapping)
    assert b.kv_cache.dtype == dtype
    torch.testing.assert_close(b.kv_cache.float(), ref_cache, equal_nan=True, atol=0, rtol=0)
    out = backend.forward(b.query, b.kv_cache, b.meta, scale)
    n = b.meta.num_actual_tokens
    torch.testing.assert_close(out[:n].float(), ref_out[:n], atol=atol, rtol=rtol)


CASES = {**{f"decode-{k}": v for k, v in DECODE.items()},
         **{f"mixed-{k}": v for k, v in MIXED.items()},
         **{f"prefill-{k}": v for k, v in PREFILL.items()}}


@cpu_only
@pytest.mark.parametrize("fmt", FP8.values(), ids=FP8.keys())
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_triton_backend_stores_torch_fp8_and_attends_over_it(case, fmt):
    check(fp8_batch(case, fmt), fmt, TritonBackend(CPU_TILES))


@cpu_only
@pytest.mark.parametrize("case", [DECODE["gqa8-d64-b16"], MIXED["gqa4-d64-b16"]],
                         ids=["decode", "mixed"])
def test_16bit_queries_take_fp16_dots(case):
    # With 16-bit queries the kernels attend in fp16 (`dot_dtype`): the probabilities are
    # rounded to fp16 before the PV dot, hence the looser tolerance.
    fmt = torch.float8_e4m3fn
    check(fp8_batch(case, fmt, compute=torch.float16), fmt, TritonBackend(CPU_TILES),
          atol=3e-3, rtol=3e-3)


@cpu_only
@pytest.mark.parametrize("case", PREFILL.values(), ids=PREFILL.keys())
def test_fresh_prefill_through_sdpa_reads_the_8bit_cache(case):
    # SDPA would otherwise attend over the batch's own full-precision keys.
    fmt = torch.float8_e4m3fn
    backend = TritonBackend(TritonTiles(sdpa_max_reqs=8, sdpa_min_tokens=0))
    b = fp8_batch(case, fmt)
    assert not backend.attends_batch_kv(b.meta, b.kv_cache, b.key)
    check(b, fmt, backend)


@pytest.mark.parametrize("fmt", FP8.values(), ids=FP8.keys())
def test_torch_backend_stores_torch_fp8(fmt):
    check(fp8_batch(MIXED["gqa4-d64-b16"], fmt), fmt, TorchNativeBackend())


@cpu_only
@pytest.mark.parametrize("fmt", FP8.values(), ids=FP8.keys())
def test_large_keys_saturate_instead_of_overflowing(fmt):
    b = fp8_batch(DECODE["gqa4-d64-b32"], fmt, scale_kv=1e5)
    slots = b.meta.slot_mapping[:b.meta.num_actual_tokens]
    for backend in (TritonBackend(CPU_TILES), TorchNativeBackend()):
        cache = b.kv_cache.clone()
        backend.write_kv(b.key, b.value, cache, b.meta.slot_mapping)
        stored = cache.float().view(2, -1, *cache.shape[-2:])[:, slots]
        assert bool(stored.isfinite().all()), backend.name
        assert float(stored.abs().max()) == torch.finfo(fmt).max, backend.name


@cpu_only
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_with_new_tokens_stores_as_the_rotary_kernel_does(splits):
    fmt = torch.float8_e4m3fn
    b = fp8_batch(DECODE["gqa8-d64-b16"], fmt, scale_kv=300.0)  # some keys saturate
    r = decode_fused_and_unfused(b, splits, 16)
    assert torch.equal(b.kv_cache.view(torch.uint8), r.unfused_cache.view(torch.uint8))
    n = b.meta.num_actual_tokens
    torch.testing.assert_close(r.fused[:n], r.unfused[:n], atol=1e-5, rtol=1e-5)
    # Both attend over the 8-bit cache, as the torch backend does over the same bytes.
    ref = TorchNativeBackend().forward(r.q_rot.float(), r.unfused_cache.float(), b.meta,
                                       b.query.shape[-1] ** -0.5)
    torch.testing.assert_close(r.fused[:n], ref[:n], atol=1e-4, rtol=1e-4)


GPU_CASES = {  # compiled, bf16 compute, Llama-3.1-8B heads
    "decode": ([1] * 20, [1 + 97 * i % 3000 for i in range(20)], 32, 8, 128, 16, 2),
    "mixed": ([1, 300, 1, 77], [2000, 1300, 45, 77], 32, 8, 128, 16, 5),
    "prefill": ([700, 37], [700, 37], 32, 8, 128, 16, 0),
    "verify": ([5, 5, 1, 3], [300, 4000, 70, 9], 32, 8, 128, 16, 1),
}


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("fmt", FP8.values(), ids=FP8.keys())
@pytest.mark.parametrize("sdpa", [0, 4], ids=["kernel", "sdpa"])
@pytest.mark.parametrize("case", GPU_CASES.values(), ids=GPU_CASES.keys())
def test_gpu_fp8_cache(case, sdpa, fmt):
    b = fp8_batch(case, fmt, device="cuda", compute=torch.bfloat16)
    check(b, fmt, TritonBackend(TritonTiles(sdpa_max_reqs=sdpa, sdpa_min_tokens=0)),
          atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("splits", [1, 7])
def test_gpu_fp8_decode_with_new_tokens(splits):
    b = fp8_batch(GPU_CASES["decode"], torch.float8_e4m3fn, device="cuda",
                  compute=torch.bfloat16)
    r = decode_fused_and_unfused(b, splits, 64)
    # The compiler may contract the rotation into FMAs differently in the two kernels: a
    # key may round to the neighbouring 8-bit value.
    torch.testing.assert_close(b.kv_cache.float(), r.unfused_cache.float(), atol=0.07,
                               rtol=0.07, equal_nan=True)
    n = b.meta.num_actual_tokens
    torch.testing.assert_close(r.fused[:n], r.unfused[:n], atol=2e-2, rtol=2e-2)
