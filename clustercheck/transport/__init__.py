"""One interface for running commands on a node, over SSH (transport.ssh) or locally (transport.local).

Every command gets a deadline; stdout and stderr are read at the same time so
large output never deadlocks. Every process clustercheck starts on a node
carries CLUSTERCHECK_RUN=<run id> in its environment and runs in its own
session; `cleanup()` kills every process that carries the marker (whatever
it forked, whatever session it moved to) and removes the run's work
directory. The pipeline calls it when a host is done, after a timeout, and on
Ctrl-C, so nothing clustercheck started is left running on any node.

A node the controller cannot reach at the end (frozen, cut off) keeps what it ran; so every command on a remote
node also ends by itself: it runs under coreutils' `timeout` with the command's own deadline plus NODE_GRACE,
and carries CLUSTERCHECK_UNTIL=<that deadline, epoch seconds>. A later run's startup sweep (`stale_sweep_script`)
stops what an earlier run left past its deadline, and names it.
"""

from __future__ import annotations

import secrets
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

RUN_MARKER = "CLUSTERCHECK_RUN"
UNTIL_MARKER = "CLUSTERCHECK_UNTIL"

# on_output(stream, text): "stdout" or "stderr" and the text as it arrives (not split into lines). A command run
# with it streams its output there instead of keeping it, so a long job's output never piles up in memory.
OutputSink = Callable[[str, str], None]
CLEANUP_TIMEOUT = 15.0
NODE_GRACE = 30.0  # seconds a command may outlive its deadline on the node (the controller acts first)
KILL_AFTER = 10  # seconds between the node-side TERM at the deadline and the KILL


def new_run_id() -> str:
    return secrets.token_hex(6)


def workdir_for(run_id: str) -> str:
    return f"/tmp/clustercheck-{run_id}"


@dataclass
class CommandResult:
    """What a command left. A program that does not exist is exit 127 and one that cannot be executed 126, as
    a shell reports them, on every transport; None means no exit status came back (killed, timed out, the
    connection lost or the command could not be started at all)."""

    exit_status: int | None
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_status == 0 and not self.timed_out

    def cause(self) -> str:
        """One line saying why the command did not succeed."""
        if self.timed_out:
            return "timed out"
        last = (self.stderr.strip().splitlines() or self.stdout.strip().splitlines() or [""])[-1]
        if self.exit_status is None:
            return f"no exit status came back {last}".strip()
        return f"exit {self.exit_status}{': ' + last if last else ''}"


class TransportError(Exception):
    """The node cannot be reached or used; the message names the host and the cause."""


class HostKeyError(TransportError):
    """An unknown or changed host key: the connection is refused (exit code 4)."""


class Transport(Protocol):
    """A connection to one node. `workdir` is this run's private directory there."""

    host: str
    run_id: str
    workdir: str

    def run(
        self,
        command: list[str],
        *,
        timeout: float,
        env: dict[str, str] | None = None,
        stdin: str | None = None,
        on_output: OutputSink | None = None,
    ) -> CommandResult: ...

    def put(self, local_path: str, remote_path: str) -> None: ...

    def get(self, remote_path: str, local_path: str) -> None: ...

    def stop(self) -> None: ...

    def cleanup(self) -> None: ...

    def close(self) -> None: ...


# One grep over every process's environment (not a process per process: a GPU node runs hundreds), printing
# "/proc/PID/environ:VARIABLE=value" for each marker variable found.
MARKED = "grep -sz -H -e '^{run}=' -e '^{until}=' /proc/[0-9]*/environ | tr '\\0' '\\n'"


def sweep_script(run_id: str, workdir: str) -> str:
    """Shell that kills every process carrying this run's marker, then removes the work directory."""
    marker = f"^{RUN_MARKER}={run_id}$"
    return (
        f"pids=$(grep -lsz {shlex.quote(marker)} /proc/[0-9]*/environ | "
        "sed -n 's|^/proc/\\([0-9]*\\)/environ$|\\1|p'); "
        '[ -z "$pids" ] || kill -KILL $pids 2>/dev/null; '
        f"rm -rf {shlex.quote(workdir)}; true"
    )


def stale_sweep_script(run_id: str, now: float | None = None) -> str:
    """Shell that kills every process of another run whose deadline (CLUSTERCHECK_UNTIL) has passed, printing
    `pid<TAB>run id<TAB>command line` for each; never this run's processes, nor those of a run still within its
    deadline (another clustercheck running now)."""
    now_s = int(now if now is not None else time.time())
    pick = (  # pid<TAB>run of every process of another run past its deadline
        '{ split($1, p, "/"); pid = p[3]; kv = substr($0, length($1) + 2); '
        f'if (index(kv, "{RUN_MARKER}=") == 1) run[pid] = substr(kv, {len(RUN_MARKER) + 2}); '
        f'else if (index(kv, "{UNTIL_MARKER}=") == 1) until[pid] = substr(kv, {len(UNTIL_MARKER) + 2}) }} '
        'END { for (pid in run) if (run[pid] != "" && run[pid] != me && until[pid] != "" && until[pid] + 0 <= now) '
        'print pid "\\t" run[pid] }'
    )
    return (
        MARKED.format(run=RUN_MARKER, until=UNTIL_MARKER)
        + f" | awk -F: -v me={shlex.quote(run_id)} -v now={now_s} {shlex.quote(pick)}"
        + " | while IFS='\t' read -r pid run; do "
        "cmd=$(tr '\\0' ' ' < \"/proc/$pid/cmdline\" 2>/dev/null | cut -c1-200); "
        'kill -KILL "$pid" 2>/dev/null && printf \'%s\\t%s\\t%s\\n\' "$pid" "$run" "$cmd"; '
        "done; true"
    )


def parse_stale(stdout: str) -> list[dict]:
    """stale_sweep_script's output: [{pid, run, command}]."""
    found = []
    for line in stdout.splitlines():
        fields = line.split("\t", 2)
        if len(fields) == 3 and fields[0].isdigit():
            found.append({"pid": int(fields[0]), "run": fields[1], "command": fields[2].strip()})
    return found


def until(timeout: float) -> str:
    """CLUSTERCHECK_UNTIL's value for a command with TIMEOUT: when a later run may stop it as left over."""
    return str(int(time.time() + timeout + NODE_GRACE) + KILL_AFTER)


def remote_command(command: list[str], env: dict[str, str], run_id: str, timeout: float | None = None) -> str:
    """The shell line that runs COMMAND with the run marker, in a session of its own; with TIMEOUT, it also ends
    by itself NODE_GRACE seconds after that deadline, whatever becomes of the controller."""
    assignments = [f"{RUN_MARKER}={run_id}"]
    limit: list[str] = []
    if timeout is not None:
        seconds = int(timeout + NODE_GRACE)
        assignments.append(f"{UNTIL_MARKER}={until(timeout)}")
        limit = ["timeout", f"--kill-after={KILL_AFTER}", str(seconds)]
    assignments += [f"{k}={v}" for k, v in env.items()]
    return " ".join(shlex.quote(w) for w in ["env", *assignments, "setsid", "-w", *limit, *command])
