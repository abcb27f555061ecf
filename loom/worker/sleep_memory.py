"""Sleep mode's device memory (vLLM's `enable_sleep_mode`): the weights and the KV cache
each live in a region whose addresses never change, so that a sleep can hand the memory
back to the driver and a wake-up can map fresh memory at the same addresses. CUDA graphs,
Inductor's code and Triton's descriptors keep the pointers they were built with and stay
valid; nothing is recaptured or recompiled.

On CUDA a region is a virtual address range of the driver's own (cuMemAddressReserve)
with physical memory mapped into it while awake (cuMemCreate / cuMemMap), called through
ctypes: the same calls as vLLM's CuMemAllocator, without a compiled extension. On the CPU
a region is one host buffer; asleep, its discarded bytes are overwritten (0xFF: NaN in
every float type) so that a test sees anything that read them.
"""

from __future__ import annotations

import ctypes
import gc
import logging
from dataclasses import dataclass, field

import torch
from torch import nn

logger = logging.getLogger(__name__)

ALIGN = 512
"""Each storage's offset in a region (cudaMalloc's own alignment is 256)."""
TAGS = ("weights", "kv_cache")


def _check(result: int, call: str) -> None:
    if result != 0:
        raise RuntimeError(f"sleep mode: {call} failed with CUDA driver error {result}")


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location", _Location), ("win32HandleMetaData", ctypes.c_void_p),
                ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class _Driver:
    """The CUDA driver's virtual memory calls (libcuda, loaded once)."""
    _lib = None

    def __init__(self, device: torch.device) -> None:
        if _Driver._lib is None:
            _Driver._lib = ctypes.CDLL("libcuda.so.1")
        self.lib = _Driver._lib
        # pinned device memory on this device (CU_MEM_ALLOCATION_TYPE_PINNED, LOCATION_DEVICE)
        self.prop = _AllocProp(type=1, location=_Location(type=1, id=device.index))
        self.access = _AccessDesc(location=_Location(type=1, id=device.index), flags=3)
        granularity = ctypes.c_size_t()
        _check(self.lib.cuMemGetAllocationGranularity(ctypes.byref(granularity),
                                                      ctypes.byref(self.prop), 0),
               "cuMemGetAllocationGranularity")
        self.granularity = granularity.value

    def reserve(self, size: int) -> int:
        ptr = ctypes.c_ulonglong()
        _check(self.lib.cuMemAddressReserve(ctypes.byref(ptr), ctypes.c_size_t(size),
                                            ctypes.c_size_t(0), ctypes.c_ulonglong(0),
                                            ctypes.c_ulonglong(0)), "cuMemAddressReserve")
        return ptr.value

    def map(self, ptr: int, size: int) -> int:
        handle = ctypes.c_ulonglong()
        _check(self.lib.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(size),
                                    ctypes.byref(self.prop), ctypes.c_ulonglong(0)),
               "cuMemCreate")
        _check(self.lib.cuMemMap(ctypes.c_ulonglong(ptr), ctypes.c_size_t(size),
                                 ctypes.c_size_t(0), handle, ctypes.c_ulonglong(0)), "cuMemMap")
        _check(self.lib.cuMemSetAccess(ctypes.c_ulonglong(ptr), ctypes.c_size_t(size),
                                       ctypes.byref(self.access), ctypes.c_size_t(1)),
               "cuMemSetAccess")
        return handle.value

    def unmap(self, ptr: int, size: int, handle: int) -> None:
        _check(self.lib.cuMemUnmap(ctypes.c_ulonglong(ptr), ctypes.c_size_t(size)), "cuMemUnmap")
        _check(self.lib.cuMemRelease(ctypes.c_ulonglong(handle)), "cuMemRelease")

    def free(self, ptr: int, size: int) -> None:
        _check(self.lib.cuMemAddressFree(ctypes.c_ulonglong(ptr), ctypes.c_size_t(size)),
               "cuMemAddressFree")


class Region:
    """`nbytes` of device memory at one address for the life of the process; tensors are
    made on it with `tensor`. `sleep` frees it (backing up the byte ranges `keep` names,
    or all of it with offload) and `wake` maps it again, restoring what was backed up."""

    def __init__(self, tag: str, device: torch.device, nbytes: int) -> None:
        self.tag, self.device, self.asleep = tag, device, False
        self._backup: list[tuple[int, torch.Tensor]] = []
        self._spare: dict[tuple[int, int], torch.Tensor] = {}
        """Host buffers of earlier sleeps, by (offset, nbytes), for the next one."""
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # (the runtime's context is current here)
            self._driver = _Driver(device)
            g = self._driver.granularity
            self.nbytes = max(g, -(-nbytes // g) * g)
            self.ptr = self._driver.reserve(self.nbytes)
            self._handle = self._driver.map(self.ptr, self.nbytes)
            self._host = None
        else:
            self._driver, self.nbytes = None, max(ALIGN, nbytes)
            self._host = torch.empty(self.nbytes, dtype=torch.uint8)
            self.ptr = self._host.data_ptr()

    def storage(self, offset: int, nbytes: int) -> torch.UntypedStorage:
        """A storage over [offset, offset + nbytes) of the region; it does not own it."""
        if offset < 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"sleep mode: {nbytes} bytes at {offset} fall outside the "
                             f"{self.tag} region ({self.nbytes} bytes)")
        return torch._C._construct_storage_from_data_pointer(self.ptr + offset, self.device,
                                                             nbytes)

    def tensor(self, offset: int, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        numel = 1
        for n in shape:
            numel *= n
        storage = self.storage(offset, numel * dtype.itemsize)
        return torch.empty(0, dtype=dtype, device=self.device).set_(storage, 0, shape)

    def _bytes(self, offset: int, nbytes: int) -> torch.Tensor:
        return self.tensor(offset, (nbytes,), torch.uint8)

    def sleep(self, keep: list[tuple[int, int]]) -> None:
        """Free the region; the (offset, nbytes) ranges of keep are backed up in host
        memory first (pinned on CUDA) and come back on wake."""
        if self.asleep:
            return
        pin = self.device.type == "cuda"
        for offset, nbytes in keep:
            # Pinning 16 GB takes ~10 s (run_zzz154), the copy ~0.5: the buffer is kept
            # for the next sleep, which pins nothing.
            host = self._spare.pop((offset, nbytes), None)
            if host is None:
                host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
            host.copy_(self._bytes(offset, nbytes))
            self._backup.append((offset, host))
        if self._driver is not None:
            torch.cuda.synchronize(self.device)
            self._driver.unmap(self.ptr, self.nbytes, self._handle)
        else:
            self._host.fill_(0xFF)
        self.asleep = True

    def __del__(self) -> None:
        """The driver's memory goes with the region (its owner, the model runner, is
        gone): mapped memory and the address range are released."""
        if getattr(self, "_driver", None) is None:
            return
        try:
            torch.cuda.synchronize(self.device)
            if not self.asleep:
                self._driver.unmap(self.ptr, self.nbytes, self._handle)
            self._driver.free(self.ptr, self.nbytes)
        except Exception:  # noqa: BLE001 - at interpreter exit the context may be gone
            pass

    def wake(self) -> None:
        if not self.asleep:
            return
        if self._driver is not None:
            self._handle = self._driver.map(self.ptr, self.nbytes)
        for offset, host in self._backup:
            self._bytes(offset, host.numel()).copy_(host)
            self._spare[(offset, host.numel())] = host
        if self._driver is not None:
            torch.cuda.synchronize(self.device)
        self._backup, self.asleep = [], False


def _module_tensors(modules: list[nn.Module]) -> tuple[list[torch.Tensor], set[int]]:
    """Every tensor the modules hold (parameters, buffers, and tensors kept as attributes,
    alone or in a list, tuple or dict), and the storages of the parameters among them."""
    found: dict[int, torch.Tensor] = {}
    params: set[int] = set()
    for module in modules:
        for m in module.modules():
            for p in m.parameters(recurse=False):
                found[id(p)] = p
                params.add(p.untyped_storage().data_ptr())
            for value in vars(m).values():
                items = value.values() if isinstance(value, dict) else (
                    value if isinstance(value, list | tuple) else (value,))
                for t in items:
                    if isinstance(t, torch.Tensor) and not isinstance(t, nn.Parameter):
                        found[id(t)] = t
            for b in m.buffers(recurse=False):
                found[id(b)] = b
    return list(found.values()), params


@dataclass
class SleepMemory:
    """One rank's regions: the model's weights (`adopt_weights`) and its KV caches
    (`kv_zeros`), and which of those tags sleep."""
    device: torch.device
    weights: Region | None = None
    kv: list[Region] = field(default_factory=list)
    buffer_ranges: list[tuple[int, int]] = field(default_factory=list)
    """The weights region's byte ranges that are not parameters (rotary tables, a
    quantized layer's derived tensors): kept through a level 2 sleep, as vLLM keeps the
    model's buffers."""
    offloaded: bool = False
    """Whether the last sleep of the weights backed them all up (level 1)."""

    @property
    def nbytes(self) -> int:
        """Device memory the regions hold (the caching allocator counts none of it)."""
        regions = ([self.weights] if self.weights is not None else []) + self.kv
        return sum(r.nbytes for r in regions)

    def adopt_weights(self, modules: list[nn.Module]) -> None:
        """Move every device tensor of the modules into one region. Tensors are moved in
        place (`Tensor.set_`), so every reference sees the new memory: the modules' own,
        and any other view of the same storages (tied embeddings, a kernel's saved
        layout), found through the garbage collector."""
        tensors, param_storages = _module_tensors(modules)
        storages: dict[int, torch.UntypedStorage] = {}
        for t in tensors:
            s = t.untyped_storage()
            if t.device == self.device and s.nbytes() > 0:
                storages.setdefault(s.data_ptr(), s)
        offsets, total = {}, 0
        for ptr, s in storages.items():
            offsets[ptr] = total
            total += -(-s.nbytes() // ALIGN) * ALIGN
        region = Region("weights", self.device, total)
        moved = {ptr: region.storage(offsets[ptr], s.nbytes()) for ptr, s in storages.items()}
        for ptr, s in storages.items():
            moved[ptr].copy_(s)
            if ptr not in param_storages:
                self.buffer_ranges.append((offsets[ptr], s.nbytes()))
        with torch.inference_mode():  # (a buffer made under inference mode moves too)
            for obj in gc.get_objects():
                # (type(): isinstance would read __class__, a deprecation warning for some)
                if issubclass(type(obj), torch.Tensor) and obj.device == self.device:
                    target = moved.get(obj.untyped_storage().data_ptr())
                    if target is not None:
                        obj.set_(target, obj.storage_offset(), obj.size(), obj.stride())
        self.weights = region
        del storages, moved, tensors
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()  # the old copies' blocks go back to the driver
        logger.info("sleep mode: %.2f GiB of weights in a region of their own (%d storages)",
                    region.nbytes / 2**30, len(offsets))

    def kv_zeros(self, count: int, shape: tuple, dtype: torch.dtype) -> list[torch.Tensor]:
        """count zeroed KV cache tensors of shape, in one region."""
        numel = 1
        for n in shape:
            numel *= n
        step = -(-numel * dtype.itemsize // ALIGN) * ALIGN
        region = Region("kv_cache", self.device, step * count)
        self.kv.append(region)
        caches = [region.tensor(i * step, shape, dtype) for i in range(count)]
        for cache in caches:
            cache.zero_()
        return caches

    def asleep(self) -> set[str]:
        """The tags whose memory is freed now."""
        tags = set()
        if self.weights is not None and self.weights.asleep:
            tags.add("weights")
        if any(r.asleep for r in self.kv):
            tags.add("kv_cache")
        return tags

    def sleep(self, tags: set[str], offload_weights: bool) -> None:
        if "weights" in tags and self.weights is not None and not self.weights.asleep:
            self.offloaded = offload_weights
            self.weights.sleep([(0, self.weights.nbytes)] if offload_weights
                               else self.buffer_ranges)
        if "kv_cache" in tags:
            for region in self.kv:
                region.sleep([])
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def wake(self, tags: set[str]) -> None:
        if "weights" in tags and self.weights is not None:
            self.weights.wake()
        if "kv_cache" in tags:
            for region in self.kv:
                region.wake()
                region._bytes(0, region.nbytes).zero_()  # a fresh cache, as at start-up

    @classmethod
    def for_runner(cls, runner) -> SleepMemory:
        """A model runner's: its model's weights (and its draft model's) adopted now."""
        memory = cls(runner.device)
        if runner.device.type == "cpu":
            logger.info("sleep mode on the CPU: a sleep overwrites what it would free (0xFF) "
                        "and frees nothing; the device memory it frees is CUDA's")
        drafter = getattr(runner, "drafter", None)
        memory.adopt_weights([runner.model] + ([drafter.model] if drafter is not None else []))
        return memory


def kv_zeros(memory: SleepMemory | None, count: int, shape: tuple, dtype: torch.dtype,
             device: torch.device) -> list[torch.Tensor]:
    """count zeroed KV cache tensors: in a sleep region where sleep mode is on."""
    if memory is not None:
        return memory.kv_zeros(count, shape, dtype)
    return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(count)]
