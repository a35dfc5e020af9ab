"""A detached job: torchrun on each node under a transient systemd unit (systemd-run), so it survives the control
machine's disconnect, the way tmux or nohup would, but with a name, a stop that reaches every process, and its
output kept. Command lines and the parsing of their answers (pure logic, no I/O).

On each node, as the SSH user: unit clustercheck-job-JOB.service (a system unit for root; a user unit otherwise,
which needs lingering so it outlives the login), and $HOME/.local/state/clustercheck/jobs/JOB/ with output.log
(torchrun's console: every rank's lines), exit-status (once torchrun ends on its own), stopped (once `stop`
stopped it), command and started. The scripts themselves are clustercheck/remote/job_*.sh.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from clustercheck.stages import bundle

UNIT_PREFIX = "clustercheck-job-"
JOBS_DIR = '"$HOME/.local/state/clustercheck/jobs"'  # expanded by the node's shell
JOB_ID = re.compile(r"^[0-9a-f]{12}$")
STOP_TIMEOUT = 15  # seconds between SIGTERM and SIGKILL when a job is stopped

REFUSED = 3  # start: the node lacks what a detached job needs; its one line on stderr says what (start_problem)
NO_JOB = 4  # logs and stop: the node has no such job (its directory is not there)

# The scripts, run with `sh -c` on the node (shell: they run where the node's Python is not known), live under
# clustercheck/remote/ (bundle.script): job_start.sh, job_list.sh, job_logs.sh, job_stop.sh, job_discard.sh, each
# after job_user.sh (the user flag and the lingering check they share). They write UNIT_PREFIX, JOBS_DIR,
# STOP_TIMEOUT, REFUSED and NO_JOB as these say (tests/unit/test_remote_jobs.py).


def script(name: str) -> str:
    """The text `sh -c` runs for the job script remote/NAME.sh: the shared prelude, then the script."""
    return bundle.script("job_user") + bundle.script(name)


def unit(job: str) -> str:
    return f"{UNIT_PREFIX}{job}.service"


def start_command(job: str, command: list[str], env: dict[str, str], cwd: str | None, code: str | None) -> list[str]:
    """The command that starts COMMAND as the job's unit on a node. CWD: the job's working directory (None: the
    home directory; "@code": the synced code); CODE: a tar.gz on the node to unpack into the job's code/."""
    assignments = [f"{k}={v}" for k, v in sorted(env.items())]
    return ["sh", "-c", script("job_start"), "sh", job, cwd or "", code or "", "env", *assignments, *command]


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
    return ["sh", "-c", script("job_discard"), "sh", job]


def list_command() -> list[str]:
    return ["sh", "-c", script("job_list")]


def logs_command(job: str, follow: bool) -> list[str]:
    return ["sh", "-c", script("job_logs"), "sh", job, "follow" if follow else ""]


def stop_command(job: str) -> list[str]:
    return ["sh", "-c", script("job_stop"), "sh", job]


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
