"""The buffers through which a decode GEMV all-reduces its own input (TP decode).

At TP=2 a decode step runs, twice a layer: a row-parallel GEMV (o_proj, down) writing
this rank's partial sums, the all-reduce + residual add + RMSNorm kernel
(`kernels/all_reduce_norm.py`, ~7 us on an H200 pair: two handshakes with the peer), then
the next column-parallel GEMV (qkv, gate_up). With an exchange, the last two are one
kernel (`gemv.add_rms_norm_gemv(..., exchange=, site=)`): one program pushes this rank's
partial rows into every peer's buffer and signals it, every program waits for the peers'
signals, then streams its weight with the all-reduced rows as the add + norm GEMV does.

Layout of each rank's share of one symmetric allocation:
  data:  [site][source rank][MAX_M rows x width] in the model's dtype; every rank writes
         its partial rows for a site into slot `its rank` of that site in every rank's
         buffer, its own included, and sums the slots of its own in rank order;
  flags: [site] int32, the number of peers whose rows for the site have landed.
One program of the consuming GEMV waits on the flag (system scope) and opens a word of its
own GPU for the others (GPU scope): `gemv._ar_push_and_wait`.

Why one area per call site, and no "read" handshake: two calls of one site are a whole
decode step apart. Before a rank pushes into a peer's area at site s of step t + 1, it has
consumed the peer's push for the site before s (or, for the first site, the peer's last
site of step t), which the peer made after its call at site s of step t had finished
reading; that call took its signals back (flag to 0) as soon as it had seen them.
So every rank must call the sites in the same order, as for any collective, and a site is
the consuming weight: the first call with a weight takes the next free site, on every
rank alike (the model's layers run in one order everywhere).
"""

from __future__ import annotations

import logging

import torch

from loom.kernels.gemv import MAX_M

logger = logging.getLogger(__name__)


class GemvExchange:
    """One rank's view of the exchange: each rank's data and flag addresses (int64 device
    tables) and the sites handed out so far. `symmetric` makes it over a process group's
    symmetric memory; tests build one over plain tensors of one device."""

    def __init__(self, rank: int, world: int, data_ptrs: torch.Tensor, flag_ptrs: torch.Tensor,
                 dtype: torch.dtype, width: int, sites: int) -> None:
        self.rank, self.world = rank, world
        self.data_ptrs, self.flag_ptrs = data_ptrs, flag_ptrs
        self.dtype, self.width, self.sites = dtype, width, sites
        self._area0 = int(data_ptrs[rank].item())  # this rank's buffer (set before capture)
        self.local = torch.zeros(1 + sites, dtype=torch.int32, device=data_ptrs.device)
        """This GPU's words: [0] counts a call's programs past their wait, [1 + site] is
        the site's `go` (the peers' rows have landed)."""
        self._site_of: dict[int, int] = {}
        self._warned = False

    @staticmethod
    def data_elems(world: int, width: int, sites: int) -> int:
        return sites * world * MAX_M * width

    @classmethod
    def symmetric(cls, c10d_name: str, device: torch.device, process_group,
                  dtype: torch.dtype, width: int, sites: int) -> GemvExchange:
        """Every rank of the group together (a rendezvous), before any CUDA graph capture."""
        import torch.distributed as dist
        from torch.distributed import _symmetric_memory as symm_mem
        world = dist.get_world_size(process_group)
        data_bytes = cls.data_elems(world, width, sites) * dtype.itemsize
        data_bytes = -(-data_bytes // 16) * 16
        storage = symm_mem.empty(data_bytes + 4 * sites, dtype=torch.uint8, device=device)
        handle = symm_mem.rendezvous(storage, c10d_name)
        storage[data_bytes:].view(torch.int32).zero_()
        ptrs = [int(p) for p in handle.buffer_ptrs]
        exchange = cls(handle.rank, handle.world_size,
                       torch.tensor(ptrs, dtype=torch.int64, device=device),
                       torch.tensor([p + data_bytes for p in ptrs], dtype=torch.int64,
                                    device=device), dtype, width, sites)
        exchange._storage = storage  # keeps the allocation alive
        torch.cuda.synchronize(device)
        index = device.index if device.index is not None else torch.cuda.current_device()
        dist.barrier(group=process_group, device_ids=[index])  # no flag signalled unzeroed
        return exchange

    def fits(self, x: torch.Tensor) -> bool:
        """Rows the kernel takes: [1..MAX_M, <= width] of the exchange's dtype, contiguous
        and 16-byte aligned (the kernel addresses the slots from x)."""
        return (x.dim() == 2 and 1 <= x.shape[0] <= MAX_M and x.shape[1] <= self.width
                and x.dtype == self.dtype and x.is_contiguous() and x.data_ptr() % 16 == 0)

    def site(self, weight: torch.Tensor) -> int | None:
        """The site of the call that reads `weight` (the first call takes the next free
        one); None once every site is taken (that call runs the all-reduce kernel instead,
        on every rank alike)."""
        key = weight.data_ptr()
        site = self._site_of.get(key)
        if site is None and len(self._site_of) < self.sites:
            site = self._site_of[key] = len(self._site_of)
        if site is None and not self._warned:
            self._warned = True
            logger.info("GEMV all-reduce: all %d sites taken; further sites run the "
                        "all-reduce + norm kernel", self.sites)
        return site

    def check(self, x: torch.Tensor, site: int) -> None:
        if not self.fits(x):
            raise ValueError(f"GEMV all-reduce: x must be [1..{MAX_M}, <= {self.width}] "
                             f"{self.dtype}, contiguous and 16-byte aligned, got "
                             f"{tuple(x.shape)} {x.dtype} at {x.data_ptr():#x}")
        if not 0 <= site < self.sites:
            raise ValueError(f"GEMV all-reduce: site {site} out of range 0..{self.sites - 1}")

    def kernel_args(self, site: int, x: torch.Tensor) -> dict:
        """The GEMV kernel's all-reduce arguments for a call at `site` reading x."""
        slot = MAX_M * self.width
        area = self._area0 + site * self.world * slot * self.dtype.itemsize
        delta, rest = divmod(area - x.data_ptr(), x.element_size())
        assert rest == 0 and (area - x.data_ptr()) % 16 == 0, "slots and x 16-byte aligned"
        return dict(ar_rank=self.rank, ar_data_ptrs=self.data_ptrs,
                    ar_flag_ptrs=self.flag_ptrs, ar_local_ptr=self.local, ar_site=site,
                    ar_area_delta=delta, AR_WORLD=self.world,
                    AR_SLOT=slot, AR_SITE_STRIDE=self.world * slot)
