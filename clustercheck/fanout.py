"""One way to run a function over many items at once: threads, an optional cap, and every item's outcome kept."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def fanout(
    function: Callable[[T], R],
    items: Iterable[T],
    *,
    limit: int | None = None,
    timeout: float | None = None,
    name: Callable[[T], str] = str,
) -> dict[int, R | BaseException]:
    """Call FUNCTION on every item in parallel (at most LIMIT at once); index -> its return value or the exception
    it raised. Waits at most TIMEOUT seconds (None: until every call ends); the calls still running then are
    left out of the answer. Ctrl-C in the calling thread propagates at once."""
    items = list(items)
    outcomes: dict[int, R | BaseException] = {}
    lock = threading.Lock()
    slots = threading.Semaphore(limit or max(1, len(items)))

    def call(index: int, item: T) -> None:
        with slots:
            try:
                value: R | BaseException = function(item)
            except BaseException as exc:  # kept for the caller: one item's trouble is that item's outcome
                value = exc
        with lock:
            outcomes[index] = value

    threads = [
        threading.Thread(target=call, args=(i, item), daemon=True, name=name(item)) for i, item in enumerate(items)
    ]
    for thread in threads:
        thread.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    for thread in threads:
        while thread.is_alive():
            if deadline is not None and time.monotonic() >= deadline:
                break
            thread.join(0.2)
    with lock:
        return dict(outcomes)
