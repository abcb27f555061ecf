"""The worker's adapter slots: which adapter sits in each, loading them, and the per-token
mask (`loom.lora.layers`) each step.

The scheduler keeps a step's adapters within max_loras (`core.lora_admission`), so a step
always finds a slot for each: one already holding it, else the least recently used slot
that this step does not need. Adapters are read from disk once and kept in host memory
(the max_cpu_loras most recently used), already sliced for this rank and scaled.

An adapter whose files cannot be read (changed or damaged since the frontend checked them)
fails alone: `prepare` reports it and points its rows at no slot, so the step keeps the
shape it was scheduled with (every rank's collectives included) and the engine ends that
adapter's requests with the error, discarding what their rows computed.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict

import numpy as np
import torch
from safetensors.torch import load_file
from torch import nn

from loom.config import EngineConfig, LoRAConfig
from loom.distributed.parallel_state import get_tp_group
from loom.layers.linear import (LinearBase, MergedColumnParallelLinear, QKVParallelLinear,
                                RowParallelLinear)
from loom.lora.adapter import WEIGHTS_FILE, AdapterSpec, model_targets, read_adapter
from loom.lora.layers import LoRASlots
from loom.lora.request import LoRARequest
from loom.pinned import upload

logger = logging.getLogger(__name__)

_SLICES = {  # loom's projection -> the checkpoint projections in it, with their shard ids
    "qkv_proj": [("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v")],
    "gate_up_proj": [("gate_proj", 0), ("up_proj", 1)],
    "o_proj": [("o_proj", None)],
    "down_proj": [("down_proj", None)],
}

Loaded = dict[str, tuple[list[torch.Tensor | None], torch.Tensor]]
"""loom module name -> each slice's A ([r, in], None: not adapted) and the B rows of this
rank ([out, r], scaled)."""


def make_lora_manager(model: nn.Module, arch, config: EngineConfig, device: torch.device,
                      dtype: torch.dtype) -> LoRAManager | None:
    """The slots for config.lora (None: LoRA off). The mask covers the largest forward:
    max_num_batched_tokens, rounded up to the TP size or to a piecewise graph's size."""
    if config.lora is None:
        return None
    name = str(dtype).removeprefix("torch.")
    if config.lora.lora_dtype not in ("auto", name):
        raise ValueError(f"lora_dtype: loom's LoRA layers compute in the model's dtype "
                         f"({name}); give auto or {name}, got {config.lora.lora_dtype!r}")
    rows = config.scheduler.max_num_batched_tokens + 256
    return LoRAManager(model, arch, config.lora, rows, device, dtype)


def _log_wide_terms(layers: dict[str, LinearBase]) -> None:
    from loom.kernels.lora import MAX_WIDTH
    widest = max((m.lora.a.shape[0] for m in layers.values()), default=0)
    if widest > MAX_WIDTH:
        logger.info("LoRA: slots x rank x slices make h up to %d wide (> %d): those layers' "
                    "decode rows take torch's three kernels, not loom's two", widest, MAX_WIDTH)


class LoRAManager:
    def __init__(self, model: nn.Module, arch, config: LoRAConfig, max_tokens: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        """max_tokens: the most token rows any forward runs (padded batches included)."""
        self.config, self.dtype = config, dtype
        self.targets = model_targets(arch)
        slots, rank = config.max_loras, config.max_lora_rank
        self.mask = torch.zeros(max_tokens, slots * rank, dtype=dtype, device=device)
        # Row s: ones over slot s's columns; the last row (the base model) is all zeros.
        self._rows = torch.zeros(slots + 1, slots * rank, dtype=dtype, device=device)
        for s in range(slots):
            self._rows[s, s * rank:(s + 1) * rank] = 1
        self.layers: dict[str, LinearBase] = {}
        for name, module in model.named_modules():
            if isinstance(module, LinearBase) and _adaptable(name, self.targets):
                module.lora = LoRASlots(module.in_features, _out_sizes(module), slots, rank,
                                        self.mask)
                self.layers[name] = module
        self.slots: list[int | None] = [None] * slots
        """The adapter id in each slot."""
        self._slot_used = [0] * slots
        self._step = 0
        self._host: OrderedDict[int, Loaded] = OrderedDict()
        self._zero_rows = len(self.mask)
        """Leading mask rows known to be all zero: a base-model step within them writes none."""
        logger.info("LoRA: %d slot(s) of rank %d on %d layers", slots, rank, len(self.layers))
        if device.type == "cuda":
            _log_wide_terms(self.layers)

    def prepare(self, loras: list[LoRARequest | None], counts: list[int],
                num_rows: int) -> dict[int, str]:
        """Put each adapter of the step in a slot, then point every token row at its own
        (counts: each request's tokens; rows past them, padding, at none). Returns the
        adapters that could not be loaded (id -> why); their rows point at none."""
        self._step += 1
        if num_rows <= self._zero_rows and all(lora is None for lora in loras):
            return {}  # no adapter this step, and no row would point at one
        slot_of: dict[int, int] = {}
        failed: dict[int, str] = {}
        for lora in loras:
            if lora is None or lora.lora_int_id in slot_of or lora.lora_int_id in failed:
                continue
            try:
                slot_of[lora.lora_int_id] = self._slot_for(lora, slot_of)
            except AdapterLoadError as e:
                failed[lora.lora_int_id] = str(e)
        base = len(self.slots)
        per_req = [base if lora is None else slot_of.get(lora.lora_int_id, base)
                   for lora in loras]
        rows = np.full(num_rows, base, dtype=np.int64)
        rows[:sum(counts)] = np.repeat(per_req, counts)
        (rows_d,) = upload([rows], self.mask.device)
        torch.index_select(self._rows, 0, rows_d, out=self.mask[:num_rows])
        self._zero_rows = num_rows if not slot_of else 0
        return failed

    def _slot_for(self, lora: LoRARequest, taken: dict[int, int]) -> int:
        if lora.lora_int_id in self.slots:
            slot = self.slots.index(lora.lora_int_id)
        else:
            loaded = self._host_copy(lora)  # first: an adapter that fails evicts nothing
            free = [s for s in range(len(self.slots)) if s not in taken.values()]
            if not free:
                raise RuntimeError(f"a step uses more than max_loras ({len(self.slots)}) "
                                   "adapters")
            slot = min(free, key=lambda s: (self.slots[s] is not None, self._slot_used[s]))
            self._fill(slot, lora.lora_int_id, loaded)
        self._slot_used[slot] = self._step
        return slot

    def _host_copy(self, lora: LoRARequest) -> Loaded:
        loaded = self._host.get(lora.lora_int_id)
        if loaded is None:
            loaded = self._read(lora)
            self._host[lora.lora_int_id] = loaded
            while len(self._host) > self.config.cpu_loras:
                self._host.popitem(last=False)
        self._host.move_to_end(lora.lora_int_id)
        return loaded

    def _fill(self, slot: int, lora_id: int, loaded: Loaded) -> None:
        for name, layer in self.layers.items():
            if name in loaded:
                a, b = loaded[name]
                # A projection with a factor folded into its weights (Granite's residual
                # multiplier): the adapter's term joins its output scaled alike.
                scale = getattr(layer, "output_scale", 1.0)
                layer.lora.set_slot(slot, a, b * scale if scale != 1.0 else b)
            else:
                layer.lora.clear_slot(slot)
        self.slots[slot] = lora_id

    def _read(self, lora: LoRARequest) -> Loaded:
        """_load, with any failure the adapter's alone (AdapterLoadError): whatever its
        files hold, no step dies of them. Every rank reads its own shard, so the ranks
        agree first: a rank that ran the adapter beside one that runs none would compute
        garbage. Each rank's slots and host cache follow the same steps, so all read the
        same adapters in the same order and meet in this all-reduce, which only steps that
        read an adapter from disk pay for."""
        where = f"lora_request {lora.lora_name!r} ({lora.lora_path})"
        try:
            loaded, error = self._load(lora), None
        except Exception as e:  # noqa: BLE001 - damaged files raise anything (safetensors')
            loaded, error = None, str(e).removeprefix(f"{where}: ") or type(e).__name__
        if _any_rank(error is not None, self.mask.device) and error is None:
            error = "another tensor-parallel rank could not read it (that rank's log says why)"
        if error is not None:
            logger.warning("LoRA adapter %r (id %d) could not be loaded from %s: %s; its "
                           "requests end with this error", lora.lora_name, lora.lora_int_id,
                           lora.lora_path, error)
            raise AdapterLoadError(f"{where}: the adapter could not be loaded: {error}")
        return loaded

    def _load(self, lora: LoRARequest) -> Loaded:
        spec = read_adapter(lora, self.targets, self.config.max_lora_rank)
        tensors = load_file(os.path.join(spec.path, WEIGHTS_FILE))
        for name, tensor in tensors.items():
            # One NaN in a slot's weights would reach every row of a batch (the masked-out
            # rows multiply it by zero), not only this adapter's requests.
            if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                raise ValueError(f"tensor {name!r} holds NaN or infinite values")
        out: Loaded = {}
        for name, layer in self.layers.items():
            a_list, b = [], torch.zeros(layer.out_features, spec.rank, dtype=self.dtype)
            for piece in _slices(name, layer, spec, tensors, self.dtype):
                if piece is None:
                    a_list.append(None)
                    continue
                shard, a, b_full = piece
                if isinstance(layer, RowParallelLinear):  # A takes this rank's inputs
                    a_local = torch.empty(spec.rank, layer.in_features, dtype=self.dtype)
                    layer.weight_loader(a_local, a)
                    a, b = a_local, b_full
                else:  # B gives this rank's outputs, at the slice's rows
                    layer.weight_loader(b, b_full, shard)
                a_list.append(a)
            if any(a is not None for a in a_list):
                out[name] = (a_list, b)
        logger.info("LoRA adapter %r (id %d, rank %d) loaded from %s", lora.lora_name,
                    lora.lora_int_id, spec.rank, spec.path)
        return out


class AdapterLoadError(Exception):
    """An adapter the workers could not load: its requests end with this message."""


def _any_rank(flag: bool, device: torch.device) -> bool:
    """Whether flag is set on any tensor-parallel rank (every rank must call it)."""
    group = get_tp_group()
    if group.world_size == 1:
        return flag
    flags = torch.tensor([int(flag)], device=device)
    torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX, group=group.group)
    return bool(flags.item())


def _adaptable(name: str, targets: dict[str, list[int]]) -> bool:
    """Whether an adapter may target the layer (or a slice of it): not, for instance,
    Qwen2-MoE's shared expert, whose projections are named as a dense MLP's."""
    prefix, _, proj = name.rpartition(".")
    names = [proj] + [ckpt for ckpt, _ in _SLICES.get(proj, [])]
    return any(f"{prefix}.{n}" in targets for n in names)


def _slices(name: str, layer: LinearBase, spec: AdapterSpec, tensors: dict[str, torch.Tensor],
            dtype: torch.dtype) -> list[tuple[object, torch.Tensor, torch.Tensor] | None]:
    """(shard id, A, B scaled) for each slice of the layer, None where the adapter leaves
    it be. An adapter of a fused module (Phi-3's qkv_proj) has one A for all its slices
    and a B holding theirs one after the other: each slice gets the A (computed once a
    slice: LoRASlots keeps an A per slice) and its own rows of B."""
    prefix, _, proj = name.rpartition(".")
    fused = spec.modules.get(name) if len(_SLICES[proj]) > 1 else None
    if fused is not None:
        a, b = _pair(tensors, fused, spec.scaling, dtype)
        return [(shard, a, rows) for (_, shard), rows in
                zip(_SLICES[proj], b.split(_full_sizes(layer)))]
    pieces = []
    for ckpt_proj, shard in _SLICES[proj]:
        names = spec.modules.get(f"{prefix}.{ckpt_proj}")
        pieces.append(None if names is None else
                      (shard, *_pair(tensors, names, spec.scaling, dtype)))
    return pieces


def _pair(tensors: dict[str, torch.Tensor], names: tuple[str, str], scaling: float,
          dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """One module's A, and its B with the adapter's scaling applied."""
    return tensors[names[0]].to(dtype), (tensors[names[1]].float() * scaling).to(dtype)


def _full_sizes(layer: LinearBase) -> list[int]:
    """Each slice's rows in the full (unsharded) weight of a stacked layer."""
    if isinstance(layer, QKVParallelLinear):
        kv = layer.kv_size * layer.tp_size // layer.kv_replicas
        return [layer.q_size * layer.tp_size, kv, kv]
    return list(layer.output_sizes)


def _out_sizes(layer: LinearBase) -> list[int]:
    if isinstance(layer, QKVParallelLinear):
        return [layer.q_size, layer.kv_size, layer.kv_size]
    if isinstance(layer, MergedColumnParallelLinear):
        return [s // layer.tp_size for s in layer.output_sizes]
    return [layer.out_features]
