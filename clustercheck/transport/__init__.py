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
and carries CLUSTERCHECK_UNTIL=<that deadline, epoch seconds>; the latest such deadline is also written into the
run's work directory (UNTIL_FILE). A later run's startup sweep (`stale_sweep_script`) stops what an earlier run left
past its deadline, removes an earlier run's work directory once none of its processes is left and its deadline has
passed, and names both. Processes of clustercheck versions that set no deadline are stopped once they are older
than NO_DEADLINE_AGE.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import secrets
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from clustercheck.remote.probing import RUN_MARKER, UNTIL_MARKER  # the node side reads them too: defined once

# on_output(stream, text): "stdout" or "stderr" and the text as it arrives (not split into lines). A command run
# with it streams its output there instead of keeping it, so a long job's output never piles up in memory.
OutputSink = Callable[[str, str], None]
CLEANUP_TIMEOUT = 15.0
NODE_GRACE = 30.0  # seconds a command may outlive its deadline on the node (the controller acts first)
KILL_AFTER = 10  # seconds between the node-side TERM at the deadline and the KILL
UNTIL_FILE = ".until"  # in the work directory: the latest CLUSTERCHECK_UNTIL of the run's commands there
NO_DEADLINE_AGE = 3600  # seconds after which a marked process without a deadline (older versions) is left over


def new_run_id() -> str:
    return secrets.token_hex(6)


WORKDIR_PREFIX = "/tmp/clustercheck-"


def workdir_for(run_id: str) -> str:
    return f"{WORKDIR_PREFIX}{run_id}"


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


@dataclass
class SessionQuirks:
    """What a node's SSH server does that the transport worked around, learnt while running commands (the
    ssh.session check reports it). Nothing on a local node."""

    startup_output: str = ""  # what the login shell's startup files printed before a command's own output
    sessions_limited: bool = False  # sshd refused a session on a connection that had others open (MaxSessions)
    connections: int = 1  # connections to the node (more than one when it limits sessions)


class TransportError(Exception):
    """The node cannot be reached or used; the message names the host and the cause. FIX: what to do about it, when
    the way the node is reached knows better than the connect check's own fix (sshd, the SSH user and key)."""

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.fix = fix


class HostKeyError(TransportError):
    """An unknown or changed host key: the connection is refused (exit code 4)."""


class Transport(Protocol):
    """A connection to one node. `workdir` is this run's private directory there."""

    host: str
    run_id: str
    workdir: str
    quirks: SessionQuirks
    channel: str  # how the node is reached, in words that take "answers": "its SSH connection", "srun to it"

    def run(
        self,
        command: list[str],
        *,
        timeout: float,
        env: dict[str, str] | None = None,
        stdin: str | None = None,
        on_output: OutputSink | None = None,
    ) -> CommandResult: ...

    def stop(self) -> None: ...

    def cleanup(self) -> None: ...

    def close(self) -> None: ...


UPLOAD_FAILED = 86  # a checked write's exit status when the file could not be written or arrived altered
TRANSFER_TIMEOUT = 60.0  # seconds every copy is given, and one more per TRANSFER_RATE bytes
TRANSFER_RATE = 1 << 20

# A shell fragment, the one way a file reaches a node: standard input (base64) written to "$f", whole or not at all,
# and checked against the SHA-256 "$sum" there. bundle.INSTALL runs it before the command it carries; put() alone.
WRITE_CHECKED = (
    'if ! base64 -d > "$f.$$" || ! got=$(sha256sum "$f.$$"); then '
    f'rm -f "$f.$$"; echo "could not write $f" >&2; exit {UPLOAD_FAILED}; fi; '
    'got=${got%% *}; if [ "$got" != "$sum" ]; then '
    f'rm -f "$f.$$"; echo "$f arrived with SHA-256 $got, not $sum" >&2; exit {UPLOAD_FAILED}; fi; '
    f'mv -f "$f.$$" "$f" || exit {UPLOAD_FAILED}'
)
# sh -c PUT sh PATH SHA256: WRITE_CHECKED into PATH, its directory made (mode 700) first.
PUT = f'f=$1; sum=$2; mkdir -p -m 700 "$(dirname "$f")" || exit {UPLOAD_FAILED}; {WRITE_CHECKED}'


def put(transport: Transport, data: bytes, remote_path: str) -> None:
    """DATA into REMOTE_PATH on TRANSPORT's node, through a command's standard input, whatever the transport (SSH,
    srun, local): written whole or not at all and checked against its SHA-256 on the node. TransportError says why
    not, naming the node."""
    sha256 = hashlib.sha256(data).hexdigest()
    answer = transport.run(
        ["sh", "-c", PUT, "sh", remote_path, sha256],
        timeout=TRANSFER_TIMEOUT + len(data) / TRANSFER_RATE,
        stdin=base64.b64encode(data).decode(),
    )
    if not answer.ok:
        raise TransportError(f"{transport.host}: could not copy {remote_path} there: {answer.cause()}")


def sweep_script(run_id: str, workdir: str) -> str:
    """Shell that kills every process carrying this run's marker, then removes the work directory."""
    marker = f"^{RUN_MARKER}={run_id}$"
    return (
        f"pids=$(grep -lsz {shlex.quote(marker)} /proc/[0-9]*/environ | "
        "sed -n 's|^/proc/\\([0-9]*\\)/environ$|\\1|p'); "
        '[ -z "$pids" ] || kill -KILL $pids 2>/dev/null; '
        f"rm -rf {shlex.quote(workdir)}; true"
    )


def stale_sweep_script(run_id: str, now: float | None = None, prefix: str = WORKDIR_PREFIX) -> str:
    """Shell that stops what other runs left on the node, printing one tab-separated line for each:
    `pid<TAB>run id<TAB>command line` for a process killed because its deadline (CLUSTERCHECK_UNTIL) has passed,
    or, without a deadline, because it is older than NO_DEADLINE_AGE; `dir<TAB>run id<TAB>path` for a work
    directory (PREFIX<run id>) removed because no process of its run is left and the run's deadline (UNTIL_FILE;
    without it, an hour after the directory was last changed) has passed. Never this run's processes or
    directory, nor those of a run still within its deadline (another clustercheck running now)."""
    now_s = int(now if now is not None else time.time())
    mine = shlex.quote(run_id)
    return (
        # Only the processes that carry a run marker, found with one grep (not one per process: a GPU node runs
        # hundreds).
        f"for d in $(grep -lsz '^{RUN_MARKER}=' /proc/[0-9]*/environ | sed -n 's|/environ$||p'); do "
        f"run=$(tr '\\0' '\\n' 2>/dev/null < \"$d/environ\" | sed -n 's/^{RUN_MARKER}=//p'); "
        f'[ -n "$run" ] && [ "$run" != {mine} ] || continue; '
        f"until=$(tr '\\0' '\\n' 2>/dev/null < \"$d/environ\" | sed -n 's/^{UNTIL_MARKER}=//p'); "
        f'if [ -n "$until" ]; then [ "$until" -le {now_s} ] || continue; '
        "else age=$(ps -o etimes= -p \"${d#/proc/}\" 2>/dev/null | tr -d ' '); "
        f'[ -n "$age" ] && [ "$age" -ge {NO_DEADLINE_AGE} ] || continue; fi; '
        "cmd=$(tr '\\0' ' ' 2>/dev/null < \"$d/cmdline\" | cut -c1-200); "
        'kill -KILL "${d#/proc/}" 2>/dev/null && killed=1 && '
        'printf \'%s\\t%s\\t%s\\n\' "${d#/proc/}" "$run" "$cmd"; '
        'done; [ -z "$killed" ] || sleep 0.5; '
        f"for w in {shlex.quote(prefix)}*; do "
        '[ -d "$w" ] && [ ! -L "$w" ] && [ -O "$w" ] || continue; '
        f'run=${{w#{shlex.quote(prefix)}}}; [ "$run" != {mine} ] || continue; '
        'case "$run" in ""|*[!0-9A-Za-z]*) continue ;; esac; '
        f'grep -qsz "^{RUN_MARKER}=$run\\$" /proc/[0-9]*/environ && continue; '
        f'u=$(cat "$w/{UNTIL_FILE}" 2>/dev/null); '
        'case "$u" in ""|*[!0-9]*) u=$(( $(stat -c %Y "$w") + 3600 )) ;; esac; '
        f'[ "$u" -le {now_s} ] || continue; '
        'rm -rf "$w" && printf \'dir\\t%s\\t%s\\n\' "$run" "$w"; '
        "done; true"
    )


def parse_stale(stdout: str) -> tuple[list[dict], list[dict]]:
    """stale_sweep_script's output: ([{pid, run, command}] of the processes, [{run, path}] of the directories)."""
    processes, directories = [], []
    for line in stdout.splitlines():
        fields = line.split("\t", 2)
        if len(fields) != 3:
            continue
        if fields[0].isdigit():
            processes.append({"pid": int(fields[0]), "run": fields[1], "command": fields[2].strip()})
        elif fields[0] == "dir":
            directories.append({"run": fields[1], "path": fields[2].strip()})
    return processes, directories


def until(timeout: float) -> str:
    """CLUSTERCHECK_UNTIL's value for a command with TIMEOUT: when a later run may stop it as left over."""
    return str(int(time.time() + timeout + NODE_GRACE) + KILL_AFTER)


def remote_command(
    command: list[str], env: dict[str, str], run_id: str, timeout: float | None = None, workdir: str | None = None
) -> str:
    """The shell line that runs COMMAND with the run marker, in a session of its own; with TIMEOUT, it also ends
    by itself NODE_GRACE seconds after that deadline, whatever becomes of the controller, and the deadline is
    recorded in WORKDIR (when it exists) for a later run's sweep."""
    assignments = [f"{RUN_MARKER}={run_id}"]
    limit: list[str] = []
    record = ""
    if timeout is not None:
        seconds = int(timeout + NODE_GRACE)
        deadline = until(timeout)
        assignments.append(f"{UNTIL_MARKER}={deadline}")
        limit = ["timeout", f"--kill-after={KILL_AFTER}", str(seconds)]
        if workdir:
            record = " ".join(shlex.quote(w) for w in ["sh", "-c", RECORD_UNTIL, "sh", workdir, deadline]) + "; "
    assignments += [f"{k}={v}" for k, v in env.items()]
    return record + " ".join(shlex.quote(w) for w in ["env", *assignments, "setsid", "-w", *limit, *command])


# sh -c RECORD_UNTIL sh WORKDIR DEADLINE: keep the latest deadline in WORKDIR/UNTIL_FILE, if WORKDIR exists.
RECORD_UNTIL = (
    f'[ -d "$1" ] || exit 0; old=$(cat "$1/{UNTIL_FILE}" 2>/dev/null); '
    f'[ "${{old:-0}}" -ge "$2" ] 2>/dev/null || echo "$2" > "$1/{UNTIL_FILE}"; true'
)


def record_until(workdir: str, deadline: str) -> None:
    """RECORD_UNTIL for a work directory on this machine."""
    path = os.path.join(workdir, UNTIL_FILE)
    if not os.path.isdir(workdir):
        return
    with contextlib.suppress(OSError, ValueError), open(path) as f:
        if int(f.read().strip() or 0) >= int(deadline):
            return
    with contextlib.suppress(OSError), open(path, "w") as f:
        f.write(deadline + "\n")
