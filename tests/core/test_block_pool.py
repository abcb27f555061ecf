import pytest

from loom.core.block_pool import BlockPool


def test_new_blocks_come_in_id_order_and_shortage_changes_nothing():
    pool = BlockPool(4, enable_prefix_caching=True)
    blocks = pool.get_new_blocks(3)
    assert [b.block_id for b in blocks] == [0, 1, 2]
    assert all(b.ref_cnt == 1 for b in blocks)
    assert pool.num_free_blocks == 1
    assert pool.usage == pytest.approx(0.75)
    with pytest.raises(ValueError):
        pool.get_new_blocks(2)
    assert pool.num_free_blocks == 1


def test_eviction_follows_free_order_and_drops_evicted_hashes():
    pool = BlockPool(4, enable_prefix_caching=True)
    b = pool.get_new_blocks(4)
    pool.cache_full_blocks(b[:2], [100, 101])
    pool.free_blocks([b[3], b[1], b[0], b[2]])
    assert pool.free_block_ids() == [3, 1, 0, 2]

    evicted = pool.get_new_blocks(2)
    assert [x.block_id for x in evicted] == [3, 1]
    assert pool.get_cached_block(101) is None  # block 1 was reused
    assert b[1].block_hash is None
    assert pool.get_cached_block(100) is b[0]  # block 0 still free but cached
    assert pool.free_block_ids() == [0, 2]


def test_touch_revives_a_free_cached_block_and_refcounts():
    pool = BlockPool(3, enable_prefix_caching=True)
    b = pool.get_new_blocks(3)
    pool.cache_full_blocks([b[0]], [7])
    pool.free_blocks([b[0], b[1], b[2]])
    hit = pool.get_cached_block(7)
    pool.touch([hit])
    pool.touch([hit])
    assert hit.ref_cnt == 2
    assert pool.free_block_ids() == [1, 2]
    pool.free_blocks([hit])
    assert pool.free_block_ids() == [1, 2]
    pool.free_blocks([hit])
    # Freed again: it goes to the back, behind blocks freed before it.
    assert pool.free_block_ids() == [1, 2, 0]


def test_double_free_raises():
    pool = BlockPool(2, enable_prefix_caching=False)
    (block,) = pool.get_new_blocks(1)
    pool.free_blocks([block])
    with pytest.raises(RuntimeError):
        pool.free_blocks([block])


def test_duplicate_hash_keeps_the_first_block():
    pool = BlockPool(2, enable_prefix_caching=True)
    first, second = pool.get_new_blocks(2)
    pool.cache_full_blocks([first], [5])
    pool.cache_full_blocks([second], [5])
    assert pool.get_cached_block(5) is first
    assert second.block_hash is None
    # Evicting the unregistered twin must not drop the entry of the first.
    pool.free_blocks([second])
    pool.get_new_blocks(1)
    assert pool.get_cached_block(5) is first


def test_caching_disabled_registers_nothing():
    pool = BlockPool(2, enable_prefix_caching=False)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [1, 2])
    assert pool.get_cached_block(1) is None
    assert blocks[0].block_hash is None


def test_reset_prefix_cache_only_when_idle():
    pool = BlockPool(2, enable_prefix_caching=True)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [1, 2])
    assert pool.reset_prefix_cache() is False
    assert pool.get_cached_block(1) is blocks[0]
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache() is True
    assert pool.get_cached_block(1) is None
    assert pool.get_cached_block(2) is None
    assert blocks[1].block_hash is None
    assert pool.num_free_blocks == 2
