"""A GPU FAIL keeps NVIDIA's RMA evidence in the run directory (stages/evidence.py): a node whose recorded
nvidia-smi -q (the H200 of records/facts-h200-vm.json) and recorded kernel log (data/xid: an Xid 79, the GPU fallen
off the bus) make gpu.xid FAIL. nvidia-bug-report.sh is a stand-in script on this machine's PATH, run through the
local transport as on a node: one that writes a report, one that hangs past its deadline."""

from __future__ import annotations

import gzip
import json
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest
from wording import says

from clustercheck.checks import registry
from clustercheck.facts import collect
from clustercheck.inventory import Node
from clustercheck.model import Status
from clustercheck.remote import facts as node
from clustercheck.remote.probing import matching_lines
from clustercheck.stages import bundle, evidence
from clustercheck.transport import CommandResult
from clustercheck.transport.local import LocalTransport

DATA = Path(__file__).parent / "data"
RECORDS = Path(__file__).parent / "records"
XID79 = DATA / "xid" / "xid79-open-gpu-kernel-modules-1151.log"


def failing_node(name: str = "gpu1"):
    """The recorded H200 node with the recorded Xid 79 in its kernel log, as the collector reads it."""
    raw = json.loads((RECORDS / "facts-h200-vm.json").read_text())
    raw["commands"]["xids"] = {**matching_lines(["cat", str(XID79)], node.XID_MARK), "source": "journalctl -k -b"}
    raw["commands"]["kernel_log"] = {"rc": 0, "out": XID79.read_text(), "err": ""}
    return raw, collect.build(Node(name=name, address=name), raw, python="python3", python_source="x")


def stand_in(tmp_path: Path, monkeypatch, body: str) -> None:
    """nvidia-bug-report.sh on PATH: a shell script of BODY (its arguments: --output-file FILE)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-bug-report.sh"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.fixture
def transport():
    local = LocalTransport("gpu1")
    yield local
    local.cleanup()


def test_a_gpu_failure_keeps_nvidia_smi_the_kernel_lines_and_the_bug_report_and_the_check_says_where(
    tmp_path, monkeypatch, transport
):
    raw, facts = failing_node()
    results = registry.run_node_checks(facts)
    assert [r.name for r in evidence.failing(results)] == ["gpu.xid"]
    stand_in(tmp_path, monkeypatch, 'echo "collecting"; echo "nvidia-smi -q: ..." | gzip > "$2.gz"')
    kept = evidence.keep(facts, transport, tmp_path / "run" / "hosts" / "gpu1", seconds=30)
    where = tmp_path / "run" / "hosts" / "gpu1" / "gpu-evidence"
    assert kept.directory == "hosts/gpu1/gpu-evidence/"
    assert (
        sorted(p.name for p in where.iterdir())
        == sorted(kept.files)
        == sorted(["nvidia-smi-q.txt", "kernel-gpu.log", "nvidia-bug-report.log.gz", "nvidia-bug-report.txt"])
    )
    assert (where / "nvidia-smi-q.txt").read_text() == raw["commands"]["nvidia_smi_q"]["out"]  # whole, as read
    lines = (where / "kernel-gpu.log").read_text().splitlines()
    assert lines == XID79.read_text().splitlines()  # every line of it is about the GPU
    assert gzip.decompress((where / "nvidia-bug-report.log.gz").read_bytes()) == b"nvidia-smi -q: ...\n"
    said = (where / "nvidia-bug-report.txt").read_text()
    assert says(said, "nvidia-bug-report.sh", "report kept") and said.endswith("\n\ncollecting\n")  # its own output
    (xid,) = [r for r in evidence.noted(results, kept) if r.name == "gpu.xid"]
    assert xid.status is Status.FAIL and xid.message.endswith(" (evidence kept: hosts/gpu1/gpu-evidence/)")
    assert xid.data["evidence"]["bug_report"] == "its report kept" and "xids" in xid.data
    assert [r.message for r in evidence.noted(results, kept) if r.name != "gpu.xid"] == [
        r.message for r in results if r.name != "gpu.xid"
    ]


def marked(marker: str) -> list[int]:
    """The processes on this machine whose command line holds MARKER."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_a_bug_report_past_its_deadline_is_stopped_with_all_it_started_and_its_partial_report_kept(
    tmp_path, monkeypatch, transport
):
    _, facts = failing_node()
    marker = f"stand-in-{tmp_path.name}"
    sleeper = f"python3 -c 'import time; time.sleep(120)' {marker}"
    stand_in(tmp_path, monkeypatch, f'echo "partial" > "$2"; echo "hanging"; {sleeper} & {sleeper}')
    started = time.monotonic()
    kept = evidence.keep(facts, transport, tmp_path / "hosts" / "gpu1", seconds=2)
    took = time.monotonic() - started
    assert 2 <= took < 2 + evidence.STOP_GRACE, took
    assert says(kept.bug_report, "ran out of time", "after 2 s", "partial report kept")
    where = tmp_path / "hosts" / "gpu1" / "gpu-evidence"
    assert (where / "nvidia-bug-report.log").read_text() == "partial\n"
    assert (where / "nvidia-bug-report.txt").read_text().startswith("nvidia-bug-report.sh: ran out of time")
    deadline = time.monotonic() + 5
    while marked(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marked(marker) == []  # the script and both of its children


def test_a_node_without_the_script_keeps_the_rest_and_says_so(tmp_path, monkeypatch, transport):
    _, facts = failing_node()
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nvidia-bug-report.sh (not installed here)
    kept = evidence.keep(facts, transport, tmp_path / "hosts" / "gpu1")
    assert says(kept.bug_report, "nvidia-bug-report.sh", "not installed")
    assert kept.files == ("nvidia-smi-q.txt", "kernel-gpu.log", "nvidia-bug-report.txt")


def test_how_the_script_ended_is_said():
    # NVIDIA's script refuses a user other than root with this line (nvidia-bug-report.sh, as the driver ships it:
    # `echo "ERROR: Please run $(basename $0) as root."`)
    refused = CommandResult(0, "rc=1\n", "ERROR: Please run nvidia-bug-report.sh as root.\n")
    refusal = evidence.parse_collected(refused, 300).said
    assert says(refusal, "exit 1", "ERROR: Please run nvidia-bug-report.sh as root.")
    killed = evidence.parse_collected(CommandResult(0, "rc=137\n", ""), 300)
    assert killed.name is None and says(killed.said, "ran out of time", "after 300 s")
    lost = evidence.parse_collected(CommandResult(None, "", "", timed_out=True), 300)
    assert lost.said.startswith("could not be run: ")


def test_xid_lines_older_than_the_kernel_log_s_day_come_first():
    _, facts = failing_node()
    facts = replace(facts, kernel_log="May 19 08:00:00 kernel: nvidia-nvlink: Nvlink Core is being initialized\n")
    assert evidence.gpu_lines(facts) == [  # verbatim: the kernel's lines, as found
        "May 18 19:02:39 kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
        "May 19 08:00:00 kernel: nvidia-nvlink: Nvlink Core is being initialized",
    ]


def test_a_run_keeps_the_evidence_of_the_node_whose_gpu_fails_and_its_failing_checks_say_where(tmp_path):
    """The pipeline over the fake test cluster (test_pipeline.py), node2 answering with the failing GPU's facts."""
    from test_pipeline import FACTS, Cluster

    from clustercheck.selection import Selection

    raw, _ = failing_node()
    facts = json.loads(FACTS)
    facts["commands"].update({k: raw["commands"][k] for k in ("nvidia_smi_q", "xids", "kernel_log")})

    def failing_gpu(transport, command, timeout):
        if len(command) > 2 and command[2] == "facts":
            return CommandResult(0, json.dumps(facts), "")
        if command[1:3] == ["-c", bundle.source(evidence.PROGRAM)]:
            return CommandResult(0, "absent\n", "")
        return None

    cluster = Cluster(behaviour={"node2": failing_gpu})
    outcome = cluster.run(tmp_path, selection=Selection(only=("core",)))
    results = {(r.name, r.host): r for r in outcome.results}
    assert results[("gpu.xid", "node2")].status is Status.FAIL
    assert results[("gpu.xid", "node2")].message.endswith("(evidence kept: hosts/node2/gpu-evidence/)")
    where = tmp_path / "hosts" / "node2" / "gpu-evidence"
    assert (where / "nvidia-smi-q.txt").read_text() == raw["commands"]["nvidia_smi_q"]["out"]
    assert "not installed on the node" in (where / "nvidia-bug-report.txt").read_text()
    assert not (tmp_path / "hosts" / "node1" / "gpu-evidence").exists()  # no GPU failing there
    assert not cluster.transports["node1"].ran("nvidia-bug-report.sh")
