"""`loom bench moe --tune`'s search when configs fail: a batch size where nothing ran says
why, and the other sizes are kept (a fake bench: the search logic needs no GPU)."""
import pytest
import torch

from loom.bench import moe
from loom.bench.moe_space import moe_shape

CONFIGS = [{"BLOCK_M": 16, "BLOCK_N": n, "BLOCK_K": 64, "GROUP_M": 1, "num_warps": 4,
            "num_stages": 3} for n in (32, 64, 128)]


class FakeBench:
    """Times each config as its BLOCK_N; at a `broken` batch size every full-length timing
    raises, as after a launch that faulted (CUDA refuses every later launch)."""

    def __init__(self, broken=()):
        self.shape = moe_shape("qwen3-30b-a3b", 1)
        self.broken, self.m, self.experts_touched = set(broken), None, 8
        self.inputs, self.quant, self.dtype = (), {}, torch.bfloat16

    def search_space(self, m):
        return list(CONFIGS)

    def set_batch(self, m):
        self.m = m

    def time_us(self, config, iters=None, budget_s=None):
        if budget_s is None and self.m in self.broken:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return float(config["BLOCK_N"])

    def check(self, config):
        return 0.0


class Bar:
    def __init__(self):
        self.lines = []

    def update(self, n):
        pass

    def set_postfix_str(self, s):
        pass

    def write(self, line):
        self.lines.append(line)


@pytest.fixture(autouse=True)
def no_compile(monkeypatch):
    monkeypatch.setattr(moe, "_precompile", lambda bench, configs: 0.0)


def test_a_size_where_no_finalist_ran_says_why():
    bench = FakeBench(broken=[16384])
    for m in (16384, 8192):
        bench.set_batch(m)
        if m in bench.broken:
            with pytest.raises(ValueError, match=r"no finalist ran at M=16384: .*illegal mem"):
                moe.tune_batch(bench, m, Bar())
        else:
            assert moe.tune_batch(bench, m, Bar())["config"]["BLOCK_N"] == 32


def test_the_sizes_tuned_are_kept_when_one_fails():
    rows, failed, _ = moe._tune_rows(FakeBench(broken=[16384]), [1, 16384, 64], 2.0)
    assert [r["batch_size"] for r in rows] == [1, 64]
    assert list(failed) == [16384] and "illegal memory" in failed[16384]
