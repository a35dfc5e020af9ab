"""Stopping a run: the flag every host's steps look at once the run is to stop, the cleanup of every node on the way
out (at the end, on Ctrl-C, on any error), and Interrupted, which names the nodes that could not be cleaned up.
"""

from __future__ import annotations

import threading

from clustercheck.reach import Reach
from clustercheck.run.record import RunRecord
from clustercheck.stages import Progress, core

CLEANUP_WAIT = 30.0  # seconds the cleanup of all nodes may take together


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM, after every node was cleaned up: UNCLEAN names the nodes that could not be, and why."""

    def __init__(self, unclean: dict[str, str]) -> None:
        super().__init__()
        self.unclean = unclean


class Abort:
    """The run's stop flag, and each host's progress reported through it (a step of a stopped run is not begun)."""

    def __init__(self, progress: Progress) -> None:
        self._event = threading.Event()
        self.progress = progress

    def is_set(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        """core.Aborted once the run is stopping."""
        if self._event.is_set():
            raise core.Aborted

    def step(self, name: str, stage: str) -> None:
        """Node NAME begins STAGE (core.Aborted instead once the run is stopping)."""
        self.check()
        self.progress(name, stage)

    def stop(self, reach: Reach, record: RunRecord) -> dict[str, str]:
        """Stop every host: kill this run's processes on every node RECORD holds a transport to (in parallel,
        bounded), then disconnect. Returns the nodes that could not be cleaned up: node -> why."""
        self._event.set()
        return reach.finish(record.open_transports(), timeout=CLEANUP_WAIT)
