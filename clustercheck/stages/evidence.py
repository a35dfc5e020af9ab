"""On a GPU FAIL (a gpu.* check FAILing on a node), what NVIDIA's RMA process asks for, kept in the run directory
as hosts/<node>/gpu-evidence/: the full `nvidia-smi -q` output and the kernel log's lines about the GPU (both as
the facts collector read them: nothing is read twice), and nvidia-bug-report.sh's report where the script is
installed on the node, under a deadline. The failing checks' messages say where it is.

NVIDIA's RMA Process (https://docs.nvidia.com/deploy/rma-process/index.html, "Tools and Diagnostics"): the driver's
nvidia-bug-report.sh gathers the system data an RMA request needs (nvidia-smi's information, lspci, the system
message logs) into nvidia-bug-report.log.gz, and is best run right after the failure is seen; it can hang on a
failing GPU, and then the part it wrote is what there is. NVIDIA's GPU Debug Guidelines
(https://docs.nvidia.com/deploy/gpu-debug-guidelines/index.html) start a node's triage from the same: the Xid
lines of the kernel log (NVRM: Xid) and `nvidia-smi -q`.

The script runs as root where the node user is root or may use `sudo -n` (it refuses otherwise, and says so),
under coreutils' `timeout`, which stops it and everything it started (its process group) at the deadline, even
under sudo, where the run marker the transport's own deadline goes by is not passed on; what it wrote by then is
kept, and the file beside it says that it ran out of time.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from pathlib import Path

from clustercheck.checks import registry
from clustercheck.facts.model import NodeFacts
from clustercheck.model import CheckResult, Status
from clustercheck.remote.bugreport import STOP_GRACE
from clustercheck.stages import bundle, nodeprogram
from clustercheck.transport import CommandResult, Transport

# The layout, in one place: hosts/<node>/DIRECTORY/ in the run directory, and the same name in the node's workdir.
DIRECTORY = "gpu-evidence"
SMI = "nvidia-smi-q.txt"  # `nvidia-smi -q`, whole, as the facts collector read it
KERNEL = "kernel-gpu.log"  # the kernel log's lines about the GPU (NVRM, Xid, nvidia)
BUG_REPORT = "nvidia-bug-report.log.gz"  # the script's report (nvidia-bug-report.log where it did not finish)
BUG_REPORT_OUTPUT = "nvidia-bug-report.txt"  # what the script printed, and how it ended
BUG_REPORT_SECONDS = 300.0  # NVIDIA's script takes a minute or two on a healthy 8-GPU node
TIMED_OUT = (124, 137)  # timeout's exit when it stopped the script (TERM, then KILL)
PROGRAM = "bugreport"  # remote/bugreport.py: nvidia-bug-report.sh on the node, its report sent back


@dataclass(frozen=True)
class BugReport:
    """What became of nvidia-bug-report.sh on the node: its report (file name and bytes), in words how it ended."""

    said: str
    name: str | None = None
    content: bytes = b""
    printed: str = ""  # what the script printed


@dataclass(frozen=True)
class Evidence:
    """What was kept for a node: the directory (relative to the run directory), its files, and the script's end."""

    directory: str
    files: tuple[str, ...]
    bug_report: str

    def to_dict(self) -> dict:
        return {"directory": self.directory, "files": list(self.files), "bug_report": self.bug_report}


def failing(results: list[CheckResult]) -> list[CheckResult]:
    """The gpu.* checks (gpu.perf.* with them) that FAIL among RESULTS: a node whose GPU needs evidence."""
    return [r for r in results if r.name.startswith("gpu.") and r.status is Status.FAIL]


def gpu_lines(facts: NodeFacts) -> list[str]:
    """The kernel log's lines about the GPU, oldest first: the Xid lines since boot (the collector's search of the
    whole log) that the last 24 hours (its kernel log) do not hold, then that log's NVRM, Xid and nvidia lines."""
    recent = [
        line
        for line in (facts.kernel_log or "").splitlines()
        if "NVRM" in line or "Xid" in line or "nvidia" in line.lower()
    ]
    seen = set(recent)
    older = [line for line in (facts.xids.lines if facts.xids else []) if line not in seen]
    return list(dict.fromkeys(older + recent))


def parse_collected(answer: CommandResult, seconds: float) -> BugReport:
    """ANSWER, that of remote/bugreport.py (pure): the report it sent back, and how the script ended within SECONDS."""
    lines = answer.stdout.splitlines()
    if lines[:1] == ["absent"]:
        return BugReport("nvidia-bug-report.sh is not installed on the node")
    status = next((line.removeprefix("rc=") for line in lines if line.startswith("rc=")), None)
    name = next((line.removeprefix("file ").strip() for line in lines if line.startswith("file ")), None)
    content = b""
    if name:
        body = "".join(lines[lines.index(f"file {name}") + 1 :])
        try:
            content = base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            name = None
    if status is None or not status.isdigit():
        said = f"could not be run: {answer.cause() if not answer.ok else 'no exit status in its answer'}"
    elif int(status) in TIMED_OUT:
        said = f"ran out of time: stopped after {seconds:.0f} s" + (", its partial report kept" if name else "")
    elif int(status) != 0:
        last = (answer.stderr.strip().splitlines() or ["no output"])[-1]
        said = f"exit {status}: {last}"
    else:
        said = "its report kept" if name else "finished without a report"
    return BugReport(said, name if content else None, content, answer.stderr)


def bug_report(transport: Transport, python: str, seconds: float = BUG_REPORT_SECONDS) -> BugReport:
    """nvidia-bug-report.sh on TRANSPORT's node, run by PYTHON (remote/bugreport.py), stopped after SECONDS (and the
    transport's deadline past it)."""
    where = f"{transport.workdir}/{DIRECTORY}"
    deadline = seconds + STOP_GRACE + 60  # the stop, and the report's way back
    argv = [python, "-c", bundle.source(PROGRAM), where, f"{seconds:g}"]
    answer = nodeprogram.run(transport, argv, timeout=deadline)
    return parse_collected(answer, seconds)


def keep(facts: NodeFacts, transport: Transport, host_dir: Path, seconds: float = BUG_REPORT_SECONDS) -> Evidence:
    """The evidence of FACTS' node into HOST_DIR/DIRECTORY: nvidia-smi -q and the GPU's kernel log lines from the
    facts, nvidia-bug-report.sh's report from the node."""
    target = host_dir / DIRECTORY
    target.mkdir(parents=True, exist_ok=True)
    smi = ((facts.raw.get("commands") or {}).get("nvidia_smi_q") or {}).get("out")
    files = []
    if smi:
        (target / SMI).write_text(smi)
        files.append(SMI)
    (target / KERNEL).write_text("".join(f"{line}\n" for line in gpu_lines(facts)))
    files.append(KERNEL)
    report = bug_report(transport, facts.python, seconds)
    if report.name:
        (target / report.name).write_bytes(report.content)
        files.append(report.name)
    (target / BUG_REPORT_OUTPUT).write_text(f"nvidia-bug-report.sh: {report.said}\n\n{report.printed}")
    files.append(BUG_REPORT_OUTPUT)
    return Evidence(f"hosts/{host_dir.name}/{DIRECTORY}/", tuple(files), report.said)


def noted(results: list[CheckResult], evidence: Evidence) -> list[CheckResult]:
    """RESULTS with the failing gpu.* checks saying where their EVIDENCE is."""
    failed = {id(r) for r in failing(results)}
    return [
        registry.with_evidence(r, evidence.directory, evidence.to_dict()) if id(r) in failed else r for r in results
    ]
