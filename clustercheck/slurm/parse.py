"""What Slurm's commands answer, read (pure): `scontrol show node` and `show job`, `squeue`, what salloc and sbatch
say they were granted or took, job ids, the version srun prints. The commands are run by call.py and the modules
that use it; what node-health does with a node's state is drain.py.

scontrol prints a record as `Key=value` fields separated by spaces, records apart by a blank line; a value may hold
spaces itself (OS=, Reason=), so a field runs to the next ` Key=`, and Reason= (always last on its line) to the
line's end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clustercheck.exitcodes import ExitCode

REASON_PREFIX = "clustercheck:"  # the reason node-health drains a node with begins with it (drain.py)
_FIELD = re.compile(r"(?:^|\s)([A-Za-z_]+)=")
_SIGNED = re.compile(r"\s*\[([^\[\]@]*)@([^\[\]]*)\]\s*$")  # " [root@2026-11-24T15:01:02]": who set it, and when

# The node states in which Slurm gives a node no new job, by sinfo(1)'s NODE STATE CODES (slurm.schedmd.com/sinfo.html):
# DOWN "unavailable for use", DRAINED "unavailable for use per system administrator request" and DRAINING "will not be
# allocated additional jobs" (scontrol shows both as the DRAIN flag), FAIL/FAILING "unavailable for use",
# NOT_RESPONDING (sinfo's and older scontrols' `*` suffix) "will not be allocated any new work", MAINT "in a
# reservation with a flag value of maintenance" and RESERVED "in an advanced reservation and not generally
# available", INVAL (registered with less than slurm.conf says), FUTURE "not fully configured". A powered-down node
# (POWERED_DOWN, power saving) is not among them: Slurm powers it up for the job that needs it.
UNUSABLE = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "MAINT", "RESERVED", "INVAL", "FUTURE")


class ParseError(ValueError):
    """The text is not `scontrol show node` output for the node."""


@dataclass(frozen=True)
class SlurmNode:
    """A node as `scontrol show node NAME` shows it: its name, its state (the base state and its flags, as in
    IDLE+DRAIN) and the reason it was drained or set down, without the `[user@time]` Slurm appends: that is
    REASON_BY (root, slurm) and REASON_AT (2026-11-29T01:02:03, as Slurm prints it)."""

    name: str
    state: tuple[str, ...]
    reason: str | None
    partitions: tuple[str, ...] = ()
    reason_by: str | None = None
    reason_at: str | None = None

    @property
    def unusable(self) -> tuple[str, ...]:
        """The flags of its state for which Slurm gives it no new job (UNUSABLE: DRAIN, DOWN, NOT_RESPONDING, ...);
        empty for a node Slurm can allocate, idle or busy."""
        flags = [f.rstrip("*") for f in self.state]
        if any(f.endswith("*") for f in self.state):  # State=DOWN*: not responding, as older scontrols print it
            flags.append("NOT_RESPONDING")
        return tuple(dict.fromkeys(f for f in flags if f.startswith(UNUSABLE)))

    @property
    def drained(self) -> bool:
        """Drained or draining (scontrol shows both as the DRAIN flag: IDLE+DRAIN, MIXED+DRAIN)."""
        return any(flag.startswith("DRAIN") for flag in self.state)

    @property
    def runs_job(self) -> bool:
        """A job runs on the node, or is ending there: the state ALLOCATED or MIXED, or the COMPLETING flag."""
        return any(flag in ("ALLOCATED", "MIXED", "COMPLETING") for flag in self.state)

    @property
    def ours(self) -> bool:
        """Drained by clustercheck: the reason is one node-health set."""
        return self.reason is not None and self.reason.startswith(REASON_PREFIX)


def parse_show_node(text: str, name: str) -> SlurmNode:
    """The node NAME from `scontrol show node NAME` (one record, or the first of several that is NAME)."""
    records = _records(text)
    for fields in records:
        if fields.get("NodeName") == name:
            return _node(fields, name)
    found = ", ".join(fields.get("NodeName", "?") for fields in records) or "no node record"
    raise ParseError(f"no node {name} in scontrol's answer ({found})")


def parse_show_nodes(text: str) -> list[SlurmNode]:
    """Every node of `scontrol show node` (without a name: all of Slurm's nodes), in its order."""
    nodes = [_node(fields, fields["NodeName"]) for fields in _records(text) if fields.get("NodeName")]
    if not nodes:
        raise ParseError("no node record in scontrol's answer")
    return nodes


def _records(text: str) -> list[dict[str, str]]:
    return [_fields(r) for r in re.split(r"\n\s*\n", text.strip()) if r.strip()]


def _node(fields: dict[str, str], name: str) -> SlurmNode:
    state = fields.get("State", "")
    if not state:
        raise ParseError(f"no State= for node {name} in scontrol's answer")
    reason, by, at = fields.get("Reason"), None, None
    if reason is not None:
        signed = _SIGNED.search(reason)
        by, at = (signed[1] or None, signed[2] or None) if signed else (None, None)
        reason = _SIGNED.sub("", reason).strip() or None
    partitions = tuple(p for p in fields.get("Partitions", "").split(",") if p)
    return SlurmNode(name, tuple(f for f in state.split("+") if f), reason, partitions, by, at)


@dataclass(frozen=True)
class SlurmPartition:
    """A partition as `scontrol show partition` shows it: its name, whether it is the default (Default=YES: where a
    job that names none goes), and its state (UP; DOWN, DRAIN, INACTIVE: it starts no new job)."""

    name: str
    default: bool
    state: str


def parse_show_partitions(text: str) -> list[SlurmPartition]:
    """Every partition of `scontrol show partition`, in its order."""
    return [
        SlurmPartition(fields["PartitionName"], fields.get("Default") == "YES", fields.get("State", "UP"))
        for fields in _records(text)
        if fields.get("PartitionName")
    ]


def _fields(record: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in record.splitlines():
        line = line.strip()
        if line.startswith("Reason="):
            fields["Reason"] = line[len("Reason=") :]
            continue
        matches = list(_FIELD.finditer(line))
        for here, after in zip(matches, [*matches[1:], None], strict=True):
            end = after.start() if after is not None else len(line)
            fields.setdefault(here.group(1), line[here.end() : end].strip())
    return fields


_VERSION = re.compile(r"^slurm(?:-wlm)?\s+(\d+)\.(\d+)", re.M)


def parse_version(text: str) -> tuple[int, int] | None:
    """(major, minor) from `srun --version` or `slurmd -V` ("slurm 22.05.8", "slurm-wlm 23.11.4"); None if absent."""
    match = _VERSION.search(text)
    return (int(match[1]), int(match[2])) if match else None


def allocation_nodes(hostnames_output: str) -> list[str]:
    """The node names `scontrol show hostnames NODELIST` prints, one per line, in the allocation's order."""
    return [line.strip() for line in hostnames_output.splitlines() if line.strip()]


_RESIZE = re.compile(r'^(?:export (?P<name>SLURM_\w+)=(?P<value>"[^"]*"|\S*)|unset (?P<unset>SLURM_\w+))\s*$', re.M)


def resize_environment(script: str) -> dict[str, str | None]:
    """What Slurm's resize script (slurm_job_<id>_resize.sh, which `scontrol update JobId=...` writes when it
    shrinks a job) does to the job's variables for its later steps: `export SLURM_NNODES=2` and `export
    SLURM_JOB_NODELIST="node[1-2]"` set a value, `unset SLURM_NTASKS` removes one (None)."""
    found: dict[str, str | None] = {}
    for match in _RESIZE.finditer(script):
        if match["unset"]:
            found[match["unset"]] = None
        else:
            found[match["name"]] = match["value"].removeprefix('"').removesuffix('"')
    return found


_GRANTED = re.compile(r"\bGranted job allocation (\d+)\b")
_PENDING = re.compile(r"\bPending job allocation (\d+)\b")


def pending_job(salloc_output: str) -> str | None:
    """The job id `salloc` says it waits for ("salloc: Pending job allocation 6"), or None."""
    match = _PENDING.search(salloc_output)
    return match[1] if match else None


def granted_job(salloc_output: str) -> str | None:
    """The job id `salloc` says it was granted ("salloc: Granted job allocation 42"), or None."""
    match = _GRANTED.search(salloc_output)
    return match[1] if match else None


ENDED = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
)
_ENDED_WHY = {
    "CANCELLED": "was cancelled (scancel, or an administrator)",
    "TIMEOUT": "reached its time limit (--time)",
    "NODE_FAIL": "lost a node (NODE_FAIL: Slurm found one of its nodes down)",
    "PREEMPTED": "was preempted by a job of higher priority",
    "OUT_OF_MEMORY": "ran out of memory on a node (OUT_OF_MEMORY)",
    "BOOT_FAIL": "could not start: a node failed to boot (BOOT_FAIL)",
    "DEADLINE": "reached its deadline (DEADLINE)",
}


@dataclass(frozen=True)
class SlurmJob:
    """A job as `scontrol show job JOB` shows it: its state (RUNNING, COMPLETED, ...), the exit code and
    signal of its batch script (ExitCode=N:S), its nodes, the node its batch script runs on, where its output goes
    (StdOut=), and why it waits (Reason=)."""

    job: str
    name: str
    state: str
    exit_code: int | None = None
    signal: int | None = None
    nodes: str | None = None
    batch_host: str | None = None
    stdout: str | None = None
    reason: str | None = None
    workdir: str | None = None

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    def status(self) -> tuple[int, str]:
        """What clustercheck exits with for an ended job, and what it says: the batch script's own exit code
        (clustercheck launch's inside the job), 128+signal when a signal ended it, 1 for an end Slurm imposed."""
        if self.state == "COMPLETED":
            return 0, f"Slurm job {self.job} completed (exit 0)"
        if self.reason == "JobLaunchFailure":  # slurmd could not start the batch script: ExitCode 0:53, no signal
            where = f" on {self.batch_host}" if self.batch_host else ""
            return ExitCode.NOT_STARTED, (
                f"Slurm job {self.job} could not start its batch script{where} (JobLaunchFailure): slurmd could not "
                f"open its output file ({self.stdout}) or working directory ({self.workdir}) there; both must exist "
                "on every node: run from, and put --run-dir on, a filesystem the nodes share"
            )
        if self.state == "FAILED" and self.exit_code:
            return self.exit_code, f"Slurm job {self.job} failed (exit {self.exit_code})"
        if self.state == "FAILED" and self.signal:
            return (
                128 + self.signal,
                f"Slurm job {self.job} failed: its batch script was killed by signal {self.signal}",
            )
        why = _ENDED_WHY.get(self.state, f"ended in state {self.state}")
        return 1, f"Slurm job {self.job} {why}"


def parse_show_job(text: str, job: str) -> SlurmJob | None:
    """Job JOB from `scontrol show job JOB`; None when Slurm no longer knows it ("Invalid job id specified", after
    MinJobAge) or the answer holds no record of it."""
    for record in re.split(r"\n\s*\n", text.strip()):
        fields = _fields(record)
        if fields.get("JobId") == job and fields.get("JobState"):
            code, sig = _exit_code(fields.get("ExitCode"))
            return SlurmJob(
                job,
                fields.get("JobName", ""),
                fields["JobState"],
                code,
                sig,
                _value(fields.get("NodeList")),
                _value(fields.get("BatchHost")),
                _value(fields.get("StdOut")),
                _value(fields.get("Reason")),
                _value(fields.get("WorkDir")),
            )
    return None


def _exit_code(text: str | None) -> tuple[int | None, int | None]:
    match = re.fullmatch(r"(\d+):(\d+)", (text or "").strip())
    return (int(match[1]), int(match[2])) if match else (None, None)


def _value(text: str | None) -> str | None:
    return None if text is None or text.strip() in ("", "(null)", "None") else text.strip()


def submitted_job(sbatch_output: str) -> str | None:
    """The job id `sbatch --parsable` prints ("42", or "42;cluster" on a federation), or None."""
    match = re.match(r"\s*(\d+)(?:;\S+)?\s*$", sbatch_output)
    return match[1] if match else None


JOB_ID = re.compile(r"\d{1,10}")  # Slurm's job ids: decimal, below MaxJobId (67,043,328 by default)


def is_job_id(text: str) -> bool:
    """Whether TEXT is a Slurm job id (clustercheck's own job ids are 12 hexadecimal digits)."""
    return JOB_ID.fullmatch(text) is not None


SQUEUE_FORMAT = "%i|%T|%S|%N|%r"  # job id, state, start time, nodes, reason


@dataclass(frozen=True)
class Queued:
    """A job as `squeue --format=SQUEUE_FORMAT` lists it."""

    job: str
    state: str
    start: str
    nodes: str
    reason: str

    def line(self) -> str:
        """`clustercheck jobs --slurm`'s line: id, start time, state, and where it runs or why it waits."""
        where = f"on {self.nodes}" if self.nodes else f"({self.reason})"
        start = "not started" if self.state == "PENDING" or self.start in ("", "N/A") else self.start  # an estimate
        return f"{self.job}  {start}  {self.state} {where}"


def parse_squeue(text: str) -> list[Queued]:
    """The jobs of `squeue --noheader --format=SQUEUE_FORMAT`, one per line."""
    return [Queued(*parts) for line in text.splitlines() if len(parts := line.strip().split("|")) == 5]
