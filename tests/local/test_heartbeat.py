"""A rank's heartbeat, for real: a process of its own beside the rank, so it beats while the rank waits in a call
that holds the GIL, stops when the rank is stopped, and ends the rank when torchrun (its parent) is gone."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import clustercheck

RANK = textwrap.dedent(
    """
    import re, sys, time
    sys.path.insert(0, {root!r})
    from clustercheck.remote.common import progress, run_rank

    def work(record):
        for step in range(1, 4):
            progress(step, "train")
            time.sleep(0.5)
        print("holding the GIL", flush=True)
        re.match(r"(a+)+$", "a" * 40 + "b")  # catastrophic backtracking: minutes without releasing the GIL

    run_rank({out!r}, {{"rank": 0}}, work)
    """
)


def beats(out: Path) -> dict:
    return json.loads((out / "heartbeat" / "rank-0.json").read_text())


def age(out: Path) -> float:
    return time.time() - (out / "heartbeat" / "rank-0.json").stat().st_mtime


def test_the_heartbeat_beats_through_a_gil_holding_call_stops_with_the_rank_and_ends_it_without_torchrun():
    out = Path(tempfile.mkdtemp(prefix="clustercheck-heartbeat-"))
    script = out / "rank.py"
    script.write_text(RANK.format(root=str(Path(clustercheck.__file__).parent.parent), out=str(out)))
    # The shell stands in for torchrun: the rank's parent.
    agent = subprocess.Popen(["sh", "-c", f"{sys.executable} {script} & wait"], stdout=subprocess.PIPE, text=True)
    try:
        assert agent.stdout.readline().strip() == "holding the GIL"
        rank_pid = beats(out)["pid"]
        cpu = beats(out)["cpu"]
        time.sleep(2.5)
        assert beats(out)["step"] == 3 and beats(out)["phase"] == "train"
        assert age(out) < 2  # still beating while the rank holds the GIL
        assert beats(out)["cpu"] > cpu  # and saying the CPU time the rank uses (the watchdog's sign of a start at work)

        os.kill(rank_pid, signal.SIGSTOP)  # a stopped rank: its heartbeat stops too
        time.sleep(3)
        assert age(out) > 2
        os.kill(rank_pid, signal.SIGCONT)

        agent.kill()  # torchrun is gone (SIGKILL: it cannot stop its ranks): the heartbeat ends the rank
        agent.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and Path(f"/proc/{rank_pid}").exists():
            time.sleep(0.2)
        assert not Path(f"/proc/{rank_pid}").exists() or "Z" in Path(f"/proc/{rank_pid}/stat").read_text().split()[2]
    finally:
        if agent.poll() is None:
            agent.kill()
        shutil.rmtree(out, ignore_errors=True)
