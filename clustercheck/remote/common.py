"""What the torchrun workers share: who this rank is, its heartbeat, and how its record is written and the rank ends.

The heartbeat: a thread rewrites OUT_DIR/heartbeat/rank-<rank>.json every second with the last step the rank
reached (`progress(step, phase)`, called by the worker per step or collective). The controller's watchdog reads
them: a rank whose file stops changing is frozen; one whose step stops changing makes no progress. The same
thread ends the rank when torchrun, its parent, is gone, so no rank outlives its job.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import traceback

BEAT_INTERVAL = 1.0
_progress = {"step": 0, "phase": "starting"}


def rank_identity() -> dict:
    """This rank as torchrun describes it, plus the host it runs on."""
    return {
        "rank": int(os.environ["RANK"]),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "host": socket.gethostname(),
    }


def progress(step: int, phase: str | None = None) -> None:
    """This rank reached STEP (of PHASE): what its next heartbeat says."""
    _progress["step"] = step
    if phase is not None:
        _progress["phase"] = phase


def _beat(path: str, parent: int) -> None:
    while True:
        if os.getppid() != parent:  # torchrun is gone (killed, or the node's job stopped): end this rank too
            os._exit(3)
        try:
            with open(path + ".tmp", "w") as fh:
                json.dump({**_progress, "pid": os.getpid()}, fh)
            os.replace(path + ".tmp", path)
        except OSError:
            pass
        time.sleep(BEAT_INTERVAL)


def start_heartbeat(out_dir: str, rank: int) -> None:
    directory = os.path.join(out_dir, "heartbeat")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"rank-{rank}.json")
    threading.Thread(target=_beat, args=(path, os.getppid()), daemon=True, name="heartbeat").start()


def run_rank(out_dir: str, record: dict, work) -> int:
    """Run WORK(record) and write RECORD to OUT_DIR/rank-<rank>.json, with ok, seconds and any error: a rank's
    error is its result for the controller, not a crash. Returns the rank's exit code. The rank's heartbeat
    runs meanwhile."""
    start_heartbeat(out_dir, record["rank"])
    record["ok"] = False
    started = time.monotonic()
    try:
        work(record)
        record["ok"] = True
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc(limit=5)
    record["seconds"] = round(time.monotonic() - started, 3)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "rank-{}.json".format(record["rank"])), "w") as fh:
        json.dump(record, fh)
    return 0 if record["ok"] else 1


def exit_now(code: int) -> None:
    """Leave without interpreter teardown: with gloo, torch can abort there ("terminate called without an
    active exception") after the work is done and the record written, turning a good run into a failed rank."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
