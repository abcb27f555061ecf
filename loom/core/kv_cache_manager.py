"""Per-request block tables over the block pool, with prefix caching by block hash chains.

A full block is identified by the hash of (hash of the block before it, its token ids), so
equal hashes mean equal whole prefixes, not just equal blocks. Only full blocks are hashed:
a partial block is still being written to.
"""

from __future__ import annotations

import array
import hashlib
from collections.abc import Sequence

from loom.core.block_pool import BlockPool, KVBlock
from loom.core.request import Request


def hash_block_tokens(parent_hash: int | None, token_ids: Sequence[int]) -> int:
    # Python's tuple hash is fast and stable within a process, and the map never leaves
    # the engine core process. It is 64 bits and not collision-resistant: a collision
    # would serve another prefix's KV (a prompt can be crafted to): --prefix-caching-hash-
    # algo sha256 takes `sha256_block_tokens` instead.
    return hash((parent_hash, tuple(token_ids)))


def sha256_block_tokens(parent_hash: int | None, token_ids: Sequence[int]) -> int:
    """vLLM's sha256 prefix hash: 256 bits over the parent's and the token ids' bytes."""
    digest = hashlib.sha256(b"" if parent_hash is None else parent_hash.to_bytes(32, "little"))
    digest.update(array.array("q", token_ids).tobytes())
    return int.from_bytes(digest.digest(), "little")


def _sha256_of(value: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(value).encode()).digest(), "little")


HASHES = {"builtin": (hash_block_tokens, hash), "sha256": (sha256_block_tokens, _sha256_of)}
"""--prefix-caching-hash-algo -> (a block's hash, a salt's hash)."""


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool,
                 hash_algo: str = "builtin") -> None:
        self._hash_block, self._hash_salt = HASHES[hash_algo]
        if block_size <= 0:
            raise ValueError(f"block_size: must be positive, got {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks, enable_prefix_caching)
        self._req_blocks: dict[str, list[KVBlock]] = {}
        self._num_hashed: dict[str, int] = {}
        """Leading blocks of each request already offered to the prefix cache."""
        self._req_hashes: dict[str, list[int]] = {}
        """Hash chain of each request's full blocks, grown as tokens arrive (never redone)."""
        self._pending_lookup: dict[str, tuple[int, int]] = {}
        """(queries, hits) of a lookup, counted once its request is admitted, so that a
        request that waits several steps for blocks is counted once."""
        self._queries = 0
        self._hits = 0

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.pool.usage

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self._req_blocks.get(request_id, ())]

    def num_blocks_of(self, request_id: str) -> int:
        """len(get_block_ids(request_id)), without building the list."""
        return len(self._req_blocks.get(request_id, ()))

    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """The longest cached prefix of the request's tokens, in whole blocks.

        It never covers the last token: the model must run on at least one token to
        produce the next one's logits.
        """
        if not self.enable_prefix_caching or request.skips_prefix_cache:
            # Prompt logprobs need the logits of every prompt position (mean/cls pooling its
            # hidden states); a cached prefix would skip computing them.
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVBlock] = []
        for block_hash in self._block_hashes(request)[:max_blocks]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        num_hit_tokens = len(hits) * self.block_size
        self._pending_lookup[request.request_id] = (request.num_tokens, num_hit_tokens)
        return hits, num_hit_tokens

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: Sequence[KVBlock] = ()) -> list[int] | None:
        """Grow the request's table to hold its computed tokens, the prefix hits and
        num_new_tokens more. Returns the ids appended, or None (and changes nothing) when
        too few blocks are free."""
        rid = request.request_id
        held = self._req_blocks.get(rid, [])
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        total = num_computed + num_new_tokens
        num_needed = max(0, cdiv(total, self.block_size) - len(held) - len(new_computed_blocks))
        # Hits sitting in the free queue stop being free once touched.
        num_revived = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if num_needed + num_revived > self.pool.num_free_blocks:
            return None
        self.pool.touch(new_computed_blocks)
        new_blocks = self.pool.get_new_blocks(num_needed)
        if rid not in self._req_blocks:
            self._on_first_allocation(rid, len(new_computed_blocks))
        blocks = self._req_blocks[rid]
        blocks.extend(new_computed_blocks)
        blocks.extend(new_blocks)
        self._cache_full_blocks(request, total)
        return [b.block_id for b in (*new_computed_blocks, *new_blocks)]

    def free(self, request: Request) -> None:
        """Release the request's blocks and forget it. The tail goes into the free queue
        first, so that it is evicted before the head: the head is the prefix that other
        requests are likeliest to share."""
        rid = request.request_id
        blocks = self._req_blocks.pop(rid, [])
        self.pool.free_blocks(reversed(blocks))
        self._num_hashed.pop(rid, None)
        self._req_hashes.pop(rid, None)
        self._pending_lookup.pop(rid, None)

    def forget_prefix(self, request: Request) -> None:
        """Take the blocks of the request's prefix out of the prefix cache, wherever they
        are (held, or freed by a preemption): their KV may not be what their hashes say."""
        if not self.enable_prefix_caching:
            return
        for block_hash in self._block_hashes(request):
            block = self.pool.get_cached_block(block_hash)
            if block is not None:
                self.pool.uncache(block)

    def make_prefix_cache_stats(self) -> tuple[int, int]:
        """(queries, hits) in tokens since the last call."""
        stats = (self._queries, self._hits)
        self._queries = self._hits = 0
        return stats

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()

    def _on_first_allocation(self, rid: str, num_hit_blocks: int) -> None:
        self._req_blocks[rid] = []
        self._num_hashed[rid] = num_hit_blocks
        queries, hits = self._pending_lookup.pop(rid, (0, 0))
        self._queries += queries
        self._hits += hits

    def _cache_full_blocks(self, request: Request, num_tokens: int) -> None:
        """Offer to the cache every block filled by the first num_tokens tokens."""
        if not self.enable_prefix_caching:
            return
        rid = request.request_id
        num_full = min(num_tokens, request.num_tokens) // self.block_size
        start = self._num_hashed[rid]
        if num_full <= start:
            return
        hashes = self._block_hashes(request)
        self.pool.cache_full_blocks(self._req_blocks[rid][start:num_full], hashes[start:num_full])
        self._num_hashed[rid] = num_full

    def _block_hashes(self, request: Request) -> list[int]:
        """The hash chain over all full blocks of the request's known tokens."""
        hashes = self._req_hashes.setdefault(request.request_id, [])
        tokens, size = request.all_token_ids, self.block_size
        salt = None if request.cache_salt is None else self._hash_salt(("cache_salt",
                                                                         request.cache_salt))
        if request.lora_request is not None:  # an adapter's KV is its own
            salt = self._hash_salt(("lora", request.lora_request.lora_int_id, salt))
        for i in range(len(hashes), len(tokens) // size):
            parent = hashes[-1] if hashes else salt
            hashes.append(self._hash_block(parent, tokens[i * size:(i + 1) * size]))
        return hashes
