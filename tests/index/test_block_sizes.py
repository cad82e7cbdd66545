"""A block shuffle's default sizes come from the budgets (`blocks.budget_sizes`), and sizes
the memory tier cannot hold are named with the settings to change (`blocks.unfit`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import aioloader as al
from aioloader.describe.blocksizes import sized
from aioloader.index.blocks import MIN_BLOCKS, budget_sizes, unfit

MiB = 1 << 20


@pytest.mark.parametrize("resident,budget,want", [
    (1 << 30, 512 * MiB, (4 * MiB, 64 * MiB)),  # the defaults: as before
    (0, 512 * MiB, (4 * MiB, 64 * MiB)),  # no memory tier: no bound from it
    (32 * MiB, 512 * MiB, (4 * MiB, 16 * MiB)),
    (8 * MiB, 512 * MiB, (1 * MiB, 4 * MiB)),
    (1 << 30, 16 * MiB, (2 * MiB, 8 * MiB)),  # the decoded-chunk cache: half the budget
])
def test_the_default_sizes_fit_the_budgets(resident, budget, want):
    assert budget_sizes(resident, budget) == want


@given(st.integers(64, 1 << 34), st.integers(64, 1 << 34))
def test_default_sizes_are_always_held_by_the_tier(resident, budget):
    block, window = budget_sizes(resident, budget)
    assert unfit(block, window, resident) is None
    assert 2 * window <= max(budget, 2 * MIN_BLOCKS) and MIN_BLOCKS * block <= window
    assert 2 * window <= resident or not resident  # room for the next window too


def test_sizes_a_tier_cannot_hold_are_named_with_both_settings():
    why = unfit(1 * MiB, 16 * MiB, 8 * MiB)
    assert why is not None
    assert "window_bytes=16777216" in why and "resident_bytes=8388608" in why
    assert "raise resident_bytes to 16777216" in why
    assert unfit(1 * MiB, 4 * MiB, 8 * MiB) is None
    assert "to 16777216" in (unfit(4 * MiB, 4 * MiB, 8 * MiB) or "")  # 4 segments, not 2
    assert unfit(4 * MiB, 4 * MiB, 8 * MiB, segment_bytes=2 * MiB) is None


def test_unset_sizes_are_written_into_the_pipeline_and_a_saved_state_wins():
    ds = al.Dataset.from_arrayrecord("/data/x-*.array_record").shuffle(3, strategy="block")
    assert "block_bytes=auto, window_bytes=auto" in ds.describe()[1]
    small = sized(ds, 8 * MiB, 512 * MiB).describe()[1]
    assert small == "shuffle(seed=3, block, block_bytes=1048576, window_bytes=4194304)"
    old = "shuffle(seed=3, block, block_bytes=4194304, window_bytes=67108864)"
    assert sized(ds, 8 * MiB, 512 * MiB, ["source(x)", old]).describe()[1] == old
    other_seed = old.replace("seed=3", "seed=4")
    assert sized(ds, 8 * MiB, 512 * MiB, [other_seed]).describe()[1] == small
    given_ = al.Dataset.from_arrayrecord("/data/x-*.array_record").shuffle(
        3, strategy="block", block_bytes=MiB, window_bytes=8 * MiB)
    assert sized(given_, 8 * MiB, 512 * MiB) is given_  # the user's own sizes stay
