"""An adapter that only one tensor-parallel rank fails to read fails on every rank: two
spawned ranks (gloo), rank 1's read made to fail. Both report it, neither keeps it, and
both go on to read it together once it reads on both: their slots and host caches never
part (a rank that had kept it would skip the next read, and its all-reduce, that the
other would wait in)."""

from __future__ import annotations

import json
import os
import socket
import sys

import torch
import torch.multiprocessing as mp

from loom.lora.adapter import model_targets
from loom.lora.dummy import write_dummy_adapter


def test_a_failure_on_one_rank_fails_the_adapter_on_every_rank(tiny_model_factory, tmp_path):
    from loom.config import ModelConfig
    from loom.models.arch import ModelArch
    from loom.models.loader import resolve
    path, _ = tiny_model_factory("llama")
    arch = ModelArch.from_hf_config(resolve(ModelConfig(path)).hf_config)
    adapter = write_dummy_adapter(model_targets(arch), str(tmp_path / "adapter"), rank=4)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(port, path, adapter, str(tmp_path)), nprocs=2, join=True)
    reports = []
    for rank in range(2):
        with open(tmp_path / f"rank{rank}.json") as f:
            reports.append(json.load(f))
    where = f"lora_request 'flaky' ({adapter}): the adapter could not be loaded: "
    assert reports[0]["failed"] == {"1": where + "another tensor-parallel rank could not "
                                    "read it (that rank's log says why)"}
    assert reports[1]["failed"] == {"1": where + "gone"}
    for report in reports:
        assert report["mask_empty"] and report["kept"] == []
        assert report["then"] == {} and report["slots"] == [1]


def _rank(rank: int, port: int, path: str, adapter: str, out_dir: str) -> None:
    from loom.config import EngineConfig, LoRAConfig, ModelConfig, ParallelConfig
    from loom.distributed.parallel_state import destroy_distributed, init_distributed
    from loom.lora.manager import LoRAManager
    from loom.lora.request import LoRARequest
    from loom.worker.model_loader import load_model
    init_distributed(2, rank, f"tcp://127.0.0.1:{port}", "gloo")
    try:
        config = EngineConfig(model=ModelConfig(path, dtype="float32"),
                              parallel=ParallelConfig(2), lora=LoRAConfig(max_lora_rank=8))
        model, arch, dtype = load_model(config, torch.device("cpu"))
        manager = LoRAManager(model, arch, config.lora, 8, torch.device("cpu"), dtype)
        lora = LoRARequest("flaky", 1, adapter)
        if rank == 1:
            manager._load = _gone
        failed = manager.prepare([lora, None], [2, 1], 3)
        report = {"failed": failed, "mask_empty": not manager.mask.any().item(),
                  "kept": list(manager._host)}
        manager.__dict__.pop("_load", None)
        report["then"] = manager.prepare([lora], [1], 1)
        report["slots"] = manager.slots
    finally:
        destroy_distributed()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as tests.compilation.tp2_harness: no interpreter teardown


def _gone(lora) -> None:
    raise OSError("gone")
