"""One thread per GPU, each on its own clock (standard library only; Python 3.8+): gpubench and gpuburn run every
GPU's work in a thread of its own and wait for them with a deadline, so that one GPU that hangs (a GSP timeout, a GPU
fallen off the bus: a CUDA call that never returns) is named with what it was doing, and the others' figures are
kept, instead of the whole program waiting for its controller's timeout and losing every GPU's answer.

Each GPU's entry says what its thread is doing in "phase" while it runs ("starting", "bf16 multiply", "load", ...);
a thread that has not finished by the deadline leaves its entry with "hung": true and that phase. The threads are
daemons: a thread stuck inside the CUDA driver cannot be stopped, so the program prints its answer and leaves
(`leave`) without waiting for them.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

DONE = "done"


def error_text(exc: BaseException) -> str:
    said = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {said[0]}" if said else type(exc).__name__


def _guarded(work: Callable[[int, dict], None], index: int, entry: dict) -> None:
    """WORK for GPU INDEX into ENTRY; an exception is ENTRY's "error", raised in the phase ENTRY names."""
    try:
        work(index, entry)
    except Exception as exc:  # the GPU's own failure is its answer; the other GPUs go on
        entry["error"] = error_text(exc)
        return
    if "error" not in entry:
        entry["phase"] = DONE


def run_each(
    count: int, work: Callable[[int, dict], None], deadline: float, clock: Callable[[], float] = time.monotonic
) -> tuple[dict[int, dict], list[int]]:
    """WORK(index, entry) for every GPU index below COUNT, each in its own thread, all at once; waits at most
    DEADLINE seconds for all of them. Returns each GPU's entry (a copy for a thread still running, so that what it
    writes later does not change the answer) and the indexes whose thread had not finished: their entries say
    "hung": true and the "phase" they were in."""
    out = {i: {"index": i, "bus_id": None, "name": None, "phase": "starting"} for i in range(count)}
    threads = [
        threading.Thread(target=_guarded, args=(work, i, out[i]), name=f"gpu{i}", daemon=True) for i in range(count)
    ]
    for thread in threads:
        thread.start()
    end = clock() + deadline
    for thread in threads:
        thread.join(max(0.0, end - clock()))
    hung = [i for i, thread in enumerate(threads) if thread.is_alive()]
    answer = {i: dict(entry) for i, entry in out.items()}
    for i in hung:
        answer[i]["hung"] = True
    for entry in answer.values():
        if entry.get("phase") == DONE:
            del entry["phase"]
    return answer, hung


def leave(text: str, hung: list[int]) -> int:
    """TEXT printed as the answer; with a thread still stuck in the driver (HUNG), the process leaves at once, since
    the interpreter's exit would wait on CUDA's teardown behind that thread."""
    print(text, flush=True)
    if hung:
        sys.stderr.flush()
        os._exit(0)
    return 0
