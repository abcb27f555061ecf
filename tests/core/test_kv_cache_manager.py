from loom.core.kv_cache_manager import KVCacheManager
from loom.core.request import Request
from loom.sampling_params import SamplingParams

BS = 4


def req(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams())


def compute(manager: KVCacheManager, request: Request, n: int, hits=()) -> list[int] | None:
    """Allocate like the scheduler does, then mark the tokens computed."""
    ids = manager.allocate_slots(request, n, hits)
    if ids is not None:
        request.num_computed_tokens += len(hits) * BS + n
    return ids


def test_allocation_grows_one_block_per_block_size_tokens():
    m = KVCacheManager(10, BS, enable_prefix_caching=False)
    r = req("a", list(range(10)))
    assert compute(m, r, 10) == [0, 1, 2]  # ceil(10 / 4) = 3 blocks
    assert m.num_free_blocks == 7
    for token, expect in [(100, []), (101, []), (102, [3])]:
        r.append_output_token(token)  # decode: 11, 12 tokens fit 3 blocks; 13 needs a 4th
        assert compute(m, r, 1) == expect
    assert m.get_block_ids("a") == [0, 1, 2, 3]
    assert m.usage == 0.4


def test_failed_allocation_changes_nothing():
    m = KVCacheManager(3, BS, enable_prefix_caching=True)
    r = req("a", list(range(13)))  # needs 4 blocks
    assert m.allocate_slots(r, 13) is None
    assert m.num_free_blocks == 3
    assert m.get_block_ids("a") == []
    assert compute(m, r, 12) == [0, 1, 2]


def test_second_request_hits_shared_full_blocks():
    m = KVCacheManager(10, BS, enable_prefix_caching=True)
    a = req("a", list(range(1, 11)))
    compute(m, a, 10)  # blocks 0, 1 full; block 2 holds 2 tokens
    b = req("b", list(range(1, 9)) + [99, 98, 97])
    hits, num_hit = m.get_computed_blocks(b)
    assert [x.block_id for x in hits] == [0, 1]
    assert num_hit == 8
    # 11 tokens need 3 blocks: two shared plus one new.
    assert compute(m, b, 3, hits) == [0, 1, 3]
    assert [m.pool.blocks[i].ref_cnt for i in (0, 1, 2, 3)] == [2, 2, 1, 1]
    assert m.num_free_blocks == 6


def test_hit_never_covers_the_whole_prompt():
    m = KVCacheManager(10, BS, enable_prefix_caching=True)
    compute(m, req("a", list(range(8))), 8)  # exactly two full blocks, both cached
    hits, num_hit = m.get_computed_blocks(req("b", list(range(8))))
    assert (len(hits), num_hit) == (1, 4)  # (8 - 1) // 4 = 1 block
    hits, num_hit = m.get_computed_blocks(req("c", list(range(9))))
    assert (len(hits), num_hit) == (2, 8)


def test_chain_hash_depends_on_the_whole_prefix():
    m = KVCacheManager(10, BS, enable_prefix_caching=True)
    compute(m, req("a", [1, 2, 3, 4, 5, 6, 7, 8, 0]), 9)
    # Same second block, different first block: no hit at all.
    assert m.get_computed_blocks(req("b", [9, 9, 9, 9, 5, 6, 7, 8, 0])) == ([], 0)


def test_hits_come_back_from_the_free_queue_after_free():
    m = KVCacheManager(4, BS, enable_prefix_caching=True)
    a = req("a", list(range(10)))
    compute(m, a, 10)
    m.free(a)
    assert m.num_free_blocks == 4
    b = req("b", list(range(10)))
    hits, num_hit = m.get_computed_blocks(b)
    assert num_hit == 8
    assert compute(m, b, 2, hits) == [0, 1, 3]  # 3, never used, heads the free queue
    assert m.num_free_blocks == 1  # 2 revived + 1 new


def test_hits_revived_from_the_free_queue_count_against_free_blocks():
    m = KVCacheManager(4, BS, enable_prefix_caching=True)
    a = req("a", list(range(9)))
    compute(m, a, 9)  # blocks 0, 1 cached, 2 partial
    m.free(a)
    compute(m, req("c", [1]), 1)  # takes block 3: 3 free, two of them cached hits
    b = req("b", list(range(8)) + [50] * 5)  # 13 tokens: 2 hits + 2 new > 3 free
    hits, _ = m.get_computed_blocks(b)
    assert len(hits) == 2
    assert m.allocate_slots(b, 5, hits) is None
    assert m.num_free_blocks == 3
    assert [m.pool.blocks[i].ref_cnt for i in (0, 1)] == [0, 0]


def test_free_puts_the_tail_first_in_eviction_order():
    m = KVCacheManager(3, BS, enable_prefix_caching=True)
    a = req("a", list(range(12)))
    compute(m, a, 12)
    m.free(a)
    assert m.pool.free_block_ids() == [2, 1, 0]
    assert m.get_block_ids("a") == []


def test_chunked_prefill_caches_blocks_as_they_fill():
    m = KVCacheManager(10, BS, enable_prefix_caching=True)
    a = req("a", list(range(10)))
    assert compute(m, a, 5) == [0, 1]  # only block 0 is full after 5 tokens
    assert m.get_computed_blocks(req("b", list(range(10))))[1] == 4
    assert compute(m, a, 5) == [2]
    assert m.get_computed_blocks(req("c", list(range(10))))[1] == 8


def test_query_and_hit_counters_count_each_admission_once():
    m = KVCacheManager(10, BS, enable_prefix_caching=True)
    a = req("a", list(range(10)))
    m.get_computed_blocks(a)
    m.get_computed_blocks(a)  # a retry after a failed admission
    compute(m, a, 10)
    assert m.make_prefix_cache_stats() == (10, 0)
    assert m.make_prefix_cache_stats() == (0, 0)
    b = req("b", list(range(9)))
    hits, _ = m.get_computed_blocks(b)
    compute(m, b, 1, hits)
    assert m.make_prefix_cache_stats() == (9, 8)


def test_prefix_caching_off_never_hits():
    m = KVCacheManager(10, BS, enable_prefix_caching=False)
    compute(m, req("a", list(range(10))), 10)
    b = req("b", list(range(10)))
    assert m.get_computed_blocks(b) == ([], 0)
    compute(m, b, 10)
    assert m.make_prefix_cache_stats() == (0, 0)
    assert m.num_free_blocks == 4


def test_reset_prefix_cache():
    m = KVCacheManager(10, BS, enable_prefix_caching=True)
    a = req("a", list(range(10)))
    compute(m, a, 10)
    assert m.reset_prefix_cache() is False
    m.free(a)
    assert m.reset_prefix_cache() is True
    assert m.get_computed_blocks(req("b", list(range(10)))) == ([], 0)


def test_prompt_logprobs_requests_skip_the_prefix_cache():
    # Every prompt position's logits are needed, so nothing may be taken from the cache.
    m = KVCacheManager(10, BS, enable_prefix_caching=True)
    a = req("a", list(range(9)))
    compute(m, a, 9)
    b = Request("b", list(range(9)), SamplingParams(prompt_logprobs=1))
    assert m.get_computed_blocks(b) == ([], 0)
    assert m.get_computed_blocks(req("c", list(range(9))))[1] == 8


def test_cache_salt_keeps_prefixes_apart():
    """vLLM's cache_salt: the same prompt shares blocks only with the same salt."""
    m = KVCacheManager(20, BS, enable_prefix_caching=True)
    tokens = list(range(1, 11))
    compute(m, Request("a", tokens, SamplingParams(), cache_salt="tenant-1"), 10)
    for rid, salt, expected in (("b", "tenant-2", 0), ("c", None, 0), ("d", "tenant-1", 8)):
        _, num_hit = m.get_computed_blocks(Request(rid, tokens, SamplingParams(),
                                                   cache_salt=salt))
        assert num_hit == expected, (rid, salt)
    compute(m, req("e", tokens), 10)  # unsalted requests still share among themselves
    assert m.get_computed_blocks(req("f", tokens))[1] == 8


def test_sha256_chains_share_prefixes_and_keep_salts_apart():
    """--prefix-caching-hash-algo sha256: 256-bit hashes, the same sharing as builtin's."""
    m = KVCacheManager(20, BS, enable_prefix_caching=True, hash_algo="sha256")
    tokens = list(range(1, 11))
    a = Request("a", tokens, SamplingParams(), cache_salt="tenant-1")
    compute(m, a, 10)
    assert all(0 <= h < 2**256 for h in m._req_hashes["a"])
    assert any(h >= 2**64 for h in m._req_hashes["a"])  # not Python's 64-bit hash
    for rid, salt, expected in (("b", "tenant-2", 0), ("c", None, 0), ("d", "tenant-1", 8)):
        _, num_hit = m.get_computed_blocks(Request(rid, tokens, SamplingParams(),
                                                   cache_salt=salt))
        assert num_hit == expected, (rid, salt)
    other = list(range(1, 9)) + [0, 0]  # the same first two blocks, then its own
    assert m.get_computed_blocks(req("e", tokens))[1] == 0
    compute(m, req("e", tokens), 10)
    assert m.get_computed_blocks(req("f", other))[1] == 8
