"""What the torchrun workers share: who this rank is, and how its record is written and the rank ends."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import traceback


def rank_identity() -> dict:
    """This rank as torchrun describes it, plus the host it runs on."""
    return {
        "rank": int(os.environ["RANK"]),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "host": socket.gethostname(),
    }


def run_rank(out_dir: str, record: dict, work) -> int:
    """Run WORK(record) and write RECORD to OUT_DIR/rank-<rank>.json, with ok, seconds and any error: a rank's
    error is its result for the controller, not a crash. Returns the rank's exit code."""
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
