"""What a run shows while it works: how many hosts are done, and the stage of the first few still under way, on one
status line that rich redraws on stderr (or on stdout when it carries nothing else)."""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator

from rich.console import Console

SHOWN = 6  # hosts under way named on the line: no walk over every host for each step


class Display:
    """The status line of a run over HOSTS; update(host, stage) from any thread, "done" when a host is."""

    def __init__(self, hosts: list[str], status) -> None:
        self.total = len(hosts)
        self.busy: dict[str, str] = dict.fromkeys(hosts, "waiting")  # the hosts not done, in order, and their stage
        self.status = status
        self._lock = threading.Lock()

    def update(self, host: str, stage: str) -> None:
        with self._lock:
            if stage == "done":
                self.busy.pop(host, None)
            else:
                self.busy[host] = stage
            shown = "  ".join(f"{h}: {s}" for h, s in itertools.islice(self.busy.items(), SHOWN))
            self.status.update(f"{self.total - len(self.busy)}/{self.total} host(s) done  {shown}")


@contextlib.contextmanager
def shown(console: Console, hosts: list[str]) -> Iterator[Display]:
    """The status line on CONSOLE while the block runs, for a run over HOSTS."""
    with console.status(f"checking {len(hosts)} host(s)") as status:
        yield Display(hosts, status)
