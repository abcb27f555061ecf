"""Every tuned table shipped in loom/kernels/configs/ loads through the reader the GPU path
uses, and each of its configs passes the launch's own checks: a table is written on a GPU
host (or, as in session 53, merged by hand from a tuner's log), and a bad entry would
otherwise surface only there, mid-run."""
import re

import pytest
import torch

from loom.kernels import gemv_decode, moe_config
from loom.kernels.gemv import MAX_M
from loom.kernels.gemv_config import _check_config
from loom.kernels.moe_config import config_dir

TABLES = sorted(p.name for p in config_dir().glob("*.json"))
GEMV = re.compile(r"^(gemv|gemv_norm),dtype=(\w+),device_name=(\w+)\.json$")
MOE = re.compile(r"^E=\d+,N=\d+,dtype=\w+,device_name=\w+\.json$")


def test_every_file_is_a_table_the_readers_know():
    assert TABLES and all(GEMV.match(n) or MOE.match(n) for n in TABLES), TABLES


@pytest.mark.parametrize("name", [n for n in TABLES if GEMV.match(n)])
def test_gemv_tables_load_and_each_config_launches(name):
    kind, dtype, gpu = GEMV.match(name).groups()
    gemv_decode._table.cache_clear()
    table = gemv_decode._table(getattr(torch, dtype), gpu, kind)
    assert table, name
    for (n, k), per_m in table.items():  # no rows at all: never fused (gemv_norm's README)
        assert n > 0 and k > 0 and all(1 <= m <= MAX_M for m in per_m), (n, k)
        for cfg in per_m.values():
            if cfg is not None:
                _check_config(cfg, k)


@pytest.mark.parametrize("name", [n for n in TABLES if MOE.match(n)])
def test_moe_tables_load_with_every_config_normalised(name):
    table = moe_config.load_config_file(str(config_dir() / name))
    assert table and all(m >= 1 for m, _ in table), name
