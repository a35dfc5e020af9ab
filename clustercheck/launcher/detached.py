"""A detached job: torchrun on each node under a transient systemd unit (systemd-run), so it survives the control
machine's disconnect, the way tmux or nohup would, but with a name, a stop that reaches every process, and its
output kept. Command lines and the parsing of their answers (pure logic, no I/O).

On each node, as the SSH user: unit clustercheck-job-JOB.service (a system unit for root; a user unit otherwise,
which needs lingering so it outlives the login), and $HOME/.local/state/clustercheck/jobs/JOB/ with output.log
(torchrun's console: every rank's lines), exit-status (once torchrun ends on its own), stopped (once `stop`
stopped it), command and started.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

UNIT_PREFIX = "clustercheck-job-"
JOBS_DIR = '"$HOME/.local/state/clustercheck/jobs"'  # expanded by the node's shell
JOB_ID = re.compile(r"^[0-9a-f]{12}$")
STOP_TIMEOUT = 15  # seconds between SIGTERM and SIGKILL when a job is stopped

# The user flag for systemctl/systemd-run, and the check that a user unit will outlive the login.
_SCOPE = (
    'uf=""; if [ "$(id -u)" != 0 ]; then uf=--user; '
    'if [ "$(loginctl show-user "$(id -un)" -p Linger --value 2>/dev/null)" != yes ]; then '
    'echo "$(id -un) has no lingering systemd user manager, so a detached job would end at logout: '
    'run: sudo loginctl enable-linger $(id -un)" >&2; exit 3; fi; fi; '
)

REFUSED = 3  # the node lacks what a detached job needs; its one line on stderr says what (start_problem)

# A detached job is a systemd unit: systemd must be PID 1 (what sd_booted() checks), not only installed.
_SYSTEMD = (
    "if [ ! -d /run/systemd/system ]; then "
    'echo "systemd is not running as PID 1 here (PID 1 is $(cat /proc/1/comm 2>/dev/null || echo unknown)), and a '
    'detached job runs as a systemd unit: launch without --detach, or on nodes booted with systemd" >&2; '
    f"exit {REFUSED}; fi; "
)

# argv: JOB, working directory ("" for $HOME, "@code" for the synced copy), the code archive ("" for none), then
# the command (env NAME=VALUE ... first). A wrapper in the unit records torchrun's exit status.
_START = (
    "set -e; "
    + _SYSTEMD
    + _SCOPE
    + 'job=$1; cwd=$2; code=$3; shift 3; dir="$HOME/.local/state/clustercheck/jobs/$job"; mkdir -p "$dir"; '
    'if [ -n "$code" ]; then mkdir -p "$dir/code"; tar xzf "$code" -C "$dir/code"; fi; '
    'case "$cwd" in "") cwd=$HOME ;; @code) cwd="$dir/code" ;; "~/"*) cwd="$HOME/${cwd#"~/"}" ;; esac; '
    'date +%s > "$dir/started"; printf "%s\\n" "$*" > "$dir/command"; : > "$dir/output.log"; '
    'systemd-run $uf --quiet --collect --unit="clustercheck-job-$job" '
    '--description="clustercheck launch job $job" --working-directory="$cwd" '
    f"-p TimeoutStopSec={STOP_TIMEOUT} "
    '-p "StandardOutput=append:$dir/output.log" -p "StandardError=append:$dir/output.log" '
    '/bin/sh -c \'status=$1; shift; "$@"; echo $? > "$status"\' sh "$dir/exit-status" "$@" '
    '|| { s=$?; rm -rf "$dir"; exit $s; }'  # a unit that never started leaves no job behind
)

# Every job directory on the node: "JOB ACTIVE-STATE EXIT-STATUS STARTED" per line ("-" when not known).
_LIST = (
    _SCOPE.replace("exit 3", "true") + f'for d in {JOBS_DIR}/*/; do [ -d "$d" ] || continue; j=$(basename "$d"); '
    f's=$(systemctl $uf is-active "{UNIT_PREFIX}$j.service" 2>/dev/null || true); '
    'e=$(cat "$d/exit-status" 2>/dev/null || true); t=$(cat "$d/started" 2>/dev/null || true); '
    'echo "$j ${s:-unknown} ${e:--} ${t:--}"; done'
)

NO_JOB = 4  # logs and stop: the node has no such job (its directory is not there)

_LOGS = (
    f"dir={JOBS_DIR}/$1; "
    f'if [ ! -d "$dir" ]; then echo "no job $1 here" >&2; exit {NO_JOB}; fi; '
    'if [ "$2" = follow ]; then '
    + _SCOPE.replace("exit 3", "true")
    + f'pid=$(systemctl $uf show -p MainPID --value "{UNIT_PREFIX}$1.service" 2>/dev/null || echo 0); '
    'if [ "${pid:-0}" != 0 ]; then exec tail -n +1 -F --pid="$pid" "$dir/output.log" 2>/dev/null; fi; fi; '
    'cat "$dir/output.log"'
)

_STOP = (
    _SCOPE.replace("exit 3", "true") + f'unit="{UNIT_PREFIX}$1.service"; '
    f'if [ ! -d {JOBS_DIR}/"$1" ]; then echo "no job $1 here" >&2; exit {NO_JOB}; fi; '
    'if systemctl $uf is-active --quiet "$unit"; then systemctl $uf stop "$unit"; '
    f': > {JOBS_DIR}/"$1"/stopped; echo stopped; '
    "else echo not-running; fi"
)


# A job that could not start on every node: stopped where it did start, and its job directory removed, so that
# `jobs --all` does not list a job that never ran.
_DISCARD = (
    _SCOPE.replace("exit 3", "true") + f'systemctl $uf stop "{UNIT_PREFIX}$1.service" 2>/dev/null || true; '
    f'rm -rf {JOBS_DIR}/"$1"'
)


def unit(job: str) -> str:
    return f"{UNIT_PREFIX}{job}.service"


def start_command(job: str, command: list[str], env: dict[str, str], cwd: str | None, code: str | None) -> list[str]:
    """The command that starts COMMAND as the job's unit on a node. CWD: the job's working directory (None: the
    home directory; "@code": the synced code); CODE: a tar.gz on the node to unpack into the job's code/."""
    assignments = [f"{k}={v}" for k, v in sorted(env.items())]
    return ["sh", "-c", _START, "sh", job, cwd or "", code or "", "env", *assignments, *command]


def start_problem(exit_status: int | None, stderr: str) -> str:
    """Why start_command failed on a node, in one line: the node's own refusal as it says it (no systemd as PID 1,
    no lingering), else systemd-run's error."""
    last = (stderr.strip().splitlines() or [""])[-1]
    if exit_status == REFUSED and last:
        return last
    return f"systemd-run failed ({'exit ' + str(exit_status) if exit_status is not None else 'no exit status'})" + (
        f": {last}" if last else ""
    )


def discard_command(job: str) -> list[str]:
    return ["sh", "-c", _DISCARD, "sh", job]


def list_command() -> list[str]:
    return ["sh", "-c", _LIST]


def logs_command(job: str, follow: bool) -> list[str]:
    return ["sh", "-c", _LOGS, "sh", job, "follow" if follow else ""]


def stop_command(job: str) -> list[str]:
    return ["sh", "-c", _STOP, "sh", job]


def no_job(exit_status: int | None) -> bool:
    """Whether logs_command's or stop_command's EXIT_STATUS says the node has no such job."""
    return exit_status == NO_JOB


def stopped(stdout: str) -> str:
    """What stop_command did on a node, in words: "stopped", or "not running"."""
    return stdout.strip().replace("-", " ")


@dataclass(frozen=True)
class NodeJob:
    """A job as one node sees it."""

    job: str
    active: str  # systemd's ActiveState: active, inactive, failed, ...
    exit_status: int | None  # torchrun's, once it ended on its own
    started: float | None

    @property
    def running(self) -> bool:
        return self.active in ("active", "activating", "reloading")

    @property
    def state(self) -> str:
        if self.running:
            return "running"
        if self.exit_status is not None:
            return f"exited {self.exit_status}"
        return "stopped"


def parse_list(stdout: str) -> list[NodeJob]:
    """list_command's lines -> NodeJob; lines that are not a job are left out."""
    jobs = []
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) != 4 or not JOB_ID.match(parts[0]):
            continue
        job, active, status, started = parts
        jobs.append(
            NodeJob(
                job,
                active,
                int(status) if status.lstrip("-").isdigit() and status != "-" else None,
                float(started) if started.isdigit() else None,
            )
        )
    return jobs


def summary(per_node: dict[str, NodeJob | None]) -> str:
    """One job across the nodes, in a few words: `running on 3/3 nodes`, `exited 0 on node1, node2; ...`."""
    states: dict[str, list[str]] = {}
    for name, job in per_node.items():
        states.setdefault(job.state if job else "not there", []).append(name)
    if len(states) == 1:
        ((state, names),) = states.items()
        return f"{state} on {len(names)}/{len(per_node)} node(s)"
    return "; ".join(f"{state} on {', '.join(names)}" for state, names in sorted(states.items()))


def shell(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
