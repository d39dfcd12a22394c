"""Items packed in order into runs of bounded weight: a transaction's sessions,
an embeddings request's texts, a facts request's messages."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def packed(
    items: Iterable[T], weight: Callable[[T], int], most: int, *, count: int | None = None
) -> Iterator[list[T]]:
    """`items` in order, in runs whose weights add up to at most `most` and
    of at most `count` items (None: any number); an item heavier than `most`
    alone is a run of its own. No run is empty.

    Example:
        list(packed(["aa", "bbb", "c"], len, 4))  # [["aa"], ["bbb", "c"]]
    """
    run: list[T] = []
    size = 0
    for item in items:
        cost = weight(item)
        if run and (size + cost > most or (count is not None and len(run) >= count)):
            yield run
            run, size = [], 0
        run.append(item)
        size += cost
    if run:
        yield run
