"""clustercheck's own jobs recognised where they hold a port: the node side reads the run marker every process of a
run carries (the one the startup sweep goes by), and network.master_port calls such a holder another clustercheck
run (when it started, who started it), to wait for or avoid with --master-port, never a stale process to kill."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from clustercheck.checks import network
from clustercheck.model import Status
from clustercheck.remote.netinfo import port_holders
from clustercheck.transport import RUN_MARKER, UNTIL_MARKER

LISTEN = (
    "import socket, time\n"
    "s = socket.socket()\n"
    "s.bind(('127.0.0.1', 0))\n"
    "s.listen()\n"
    "print(s.getsockname()[1], flush=True)\n"
    "time.sleep(60)\n"
)


def test_a_port_held_by_a_clustercheck_run_names_that_run_its_user_and_start():
    until = int(time.time()) + 300
    env = {**os.environ, RUN_MARKER: "3f2a9c0b1d2e", UNTIL_MARKER: str(until)}
    holder = subprocess.Popen([sys.executable, "-c", LISTEN], stdout=subprocess.PIPE, text=True, env=env)
    try:
        port = int(holder.stdout.readline())
        (found,) = port_holders(port)
    finally:
        holder.kill()
        holder.wait()
    assert found["pid"] == holder.pid
    job = found["clustercheck"]
    assert job["run"] == "3f2a9c0b1d2e" and job["until"] == until
    assert job["user"] and abs(job["started"] - time.time()) < 120
    other = subprocess.Popen([sys.executable, "-c", LISTEN], stdout=subprocess.PIPE, text=True)  # no run's marker
    try:
        (found,) = port_holders(int(other.stdout.readline()))
    finally:
        other.kill()
        other.wait()
    assert "clustercheck" not in found


def test_a_live_clustercheck_job_on_the_master_port_is_to_wait_for_not_to_kill():
    job = {"run": "3f2a9c0b1d2e", "until": 1795883372, "user": "alice", "started": 1795883273}
    record = {
        "listen": [
            {
                "port": 29500,
                "ok": False,
                "error": "Address already in use",
                "holders": [{"pid": 4242, "command": "python -m torch.distributed.run", "clustercheck": job}],
            }
        ]
    }
    result = network.master_port_check(record, "node1", 29500)
    assert result.status is Status.FAIL
    assert "another clustercheck run (started 2026-11-28 16:27:53 UTC by alice" in result.message
    assert "holds port 29500" in result.message
    assert "--master-port" in result.remediation and "Wait" in result.remediation
    assert "kill" not in result.remediation and "stale" not in result.remediation
