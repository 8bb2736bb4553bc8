"""``common_prefix_length``: the bisection equals the element-by-element walk, for strings and ids."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from responses_cache.tokens import common_prefix_length


def _walked(a: Sequence[object], b: Sequence[object]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@given(st.text(alphabet="ab\u00e9", max_size=40), st.text(alphabet="ab\u00e9", max_size=40))
def test_strings(a: str, b: str) -> None:
    assert common_prefix_length(a, b) == _walked(a, b) == common_prefix_length(b, a)
    assert common_prefix_length(a, a + b) == len(a)


@given(st.lists(st.integers(0, 3), max_size=40), st.lists(st.integers(0, 3), max_size=40))
def test_id_lists(a: list[int], b: list[int]) -> None:
    assert common_prefix_length(a, b) == _walked(a, b)
    assert common_prefix_length(a, a + b) == len(a)
