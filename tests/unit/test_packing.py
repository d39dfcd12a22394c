"""memchat.packing: runs of bounded weight, in order."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from memchat.packing import packed


def test_runs_keep_the_order_and_the_bounds() -> None:
    assert list(packed(["aa", "bbb", "c"], len, 4)) == [["aa"], ["bbb", "c"]]
    assert list(packed(["a"] * 5, len, 100, count=2)) == [["a", "a"], ["a", "a"], ["a"]]
    assert list(packed(["toolong", "a"], len, 3)) == [["toolong"], ["a"]]  # alone
    assert list(packed([], len, 3)) == []


@given(
    st.lists(st.integers(min_value=0, max_value=50)),
    st.integers(min_value=1, max_value=60),
    st.none() | st.integers(min_value=1, max_value=5),
)
def test_any_items_are_packed_whole_within_the_bounds(
    weights: list[int], most: int, count: int | None
) -> None:
    runs = list(packed(weights, lambda w: w, most, count=count))
    assert [w for run in runs for w in run] == weights
    for run in runs:
        assert run
        assert sum(run) <= most or len(run) == 1
        assert count is None or len(run) <= count
    # Greedy: a run is closed only when the next item would not fit.
    for run, after in itertools.pairwise(runs):
        assert sum(run) + after[0] > most or (count is not None and len(run) == count)
