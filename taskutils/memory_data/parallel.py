"""Ordered, bounded parallel map over worker processes.

Results come back in input order whatever the worker count, and at most ``window`` results are in flight,
so a consumer that writes them one by one keeps memory bounded even for multi-megabyte samples. Workers
get their read-only state (document pools, tokenizer) once, through ``initializer``; with the ``fork``
start method it is inherited, not pickled.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any


def ordered_map(
    fn: Callable[[Any], Any],
    items: Sequence[Any],
    workers: int = 1,
    initializer: Callable[..., None] | None = None,
    initargs: Iterable[Any] = (),
    window: int | None = None,
) -> Iterator[Any]:
    """``map(fn, items)`` on ``workers`` processes, in order. ``fn`` must be a module-level function."""
    initargs = tuple(initargs)
    if workers <= 1:
        if initializer is not None:
            initializer(*initargs)
        yield from map(fn, items)
        return
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    window = window or 2 * workers
    with mp.get_context(method).Pool(workers, initializer=initializer, initargs=initargs) as pool:
        for begin in range(0, len(items), window):
            yield from pool.imap(fn, items[begin : begin + window])
