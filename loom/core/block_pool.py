"""The KV-cache blocks: who holds each one, which are free, and which still hold a reusable
prefix.

A free block keeps its contents (and its hash) until it is handed out again, so a request
that arrives later with the same prefix can take it back out of the free queue. The free
queue is in eviction order: blocks are evicted from its front and freed onto its back.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class KVBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None
        """Set while the block is registered in the prefix cache."""

    def __repr__(self) -> str:
        return f"KVBlock(id={self.block_id}, ref={self.ref_cnt}, hash={self.block_hash})"


class BlockPool:
    def __init__(self, num_blocks: int, enable_prefix_caching: bool) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks: must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # An OrderedDict gives O(1) removal from the middle when a cached block is reused.
        self._free: OrderedDict[int, KVBlock] = OrderedDict((b.block_id, b) for b in self.blocks)
        self._cached: dict[int, KVBlock] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by at least one request."""
        return 1.0 - len(self._free) / self.num_blocks

    def free_block_ids(self) -> list[int]:
        """Free block ids in eviction order (front first)."""
        return list(self._free)

    def get_new_blocks(self, n: int) -> list[KVBlock]:
        if n > len(self._free):
            raise ValueError(f"asked for {n} blocks, only {len(self._free)} free")
        out = []
        for _ in range(n):
            _, block = self._free.popitem(last=False)
            self.uncache(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take a reference on prefix-cache hits, reviving those that sat in the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def free_blocks(self, blocks: Iterable[KVBlock]) -> None:
        """Drop a reference on each block; the caller passes them in eviction order."""
        for block in blocks:
            if block.ref_cnt <= 0:
                raise RuntimeError(f"double free of {block!r}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = block

    def get_cached_block(self, block_hash: int) -> KVBlock | None:
        return self._cached.get(block_hash)

    def cache_full_blocks(self, blocks: Iterable[KVBlock], block_hashes: Iterable[int]) -> None:
        """Register full blocks under their chain hashes.

        When another block already holds the same content (two requests with one prefix
        prefilled in the same step), the first keeps the entry and this one stays
        unregistered: it is freed as a plain block, so the map never points at a stranger.
        """
        if not self.enable_prefix_caching:
            return
        for block, block_hash in zip(blocks, block_hashes):
            if block.block_hash is None and block_hash not in self._cached:
                block.block_hash = block_hash
                self._cached[block_hash] = block

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix; refused (False) while any block is in use, since a
        running request's blocks must stay consistent with the map."""
        if len(self._free) != self.num_blocks:
            return False
        for block in self._cached.values():
            block.block_hash = None
        self._cached.clear()
        return True

    def uncache(self, block: KVBlock) -> None:
        """Take a block out of the prefix cache (its holders, if any, keep it)."""
        if block.block_hash is not None:
            del self._cached[block.block_hash]
            block.block_hash = None
