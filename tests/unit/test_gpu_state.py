"""What holds the GPUs and how they are set up, on recorded outputs: memory in use that no listed process holds
(another container or PID namespace), MIG per GPU, SRAM parity errors, persistence mode, and `nvidia-smi -q` read GPU
by GPU so that a long output keeps its head (tests/unit/data/README.md, "GPU state", says where each output comes
from and which lines a test edits)."""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from clustercheck.checks import registry
from clustercheck.facts import collect
from clustercheck.facts import smi as smi_parse
from clustercheck.inventory import Node
from clustercheck.model import Status
from clustercheck.remote import facts as node
from clustercheck.remote import probing
from clustercheck.run import health
from clustercheck.slurm.drain import decide
from clustercheck.slurm.parse import parse_show_node

DATA = Path(__file__).parent / "data"
RECORDS = Path(__file__).parent / "records"
H200_RECORD = json.loads((RECORDS / "facts-h200-vm.json").read_text())
H200 = H200_RECORD["commands"]["nvidia_smi_q"]["out"]
H800 = (DATA / "nvidia-smi-q-h800.txt").read_text()
A10G = (DATA / "nvidia-smi-q-a10g-process-dcgm-232.txt").read_text()
MIG_LIST = (DATA / "nvidia-smi-L-mig-a100-datadog-33120.txt").read_text()
POD_TABLE = (DATA / "nvidia-smi-container-memory-no-process-pai-2001.txt").read_text()
TORCH_CPU = {"version": "2.13.0+cpu", "cuda": None, "cuda_available": False, "device_count": 0, "gloo": True}


def judged(smi: str, listed: str | None = None, slurm_job: bool | None = None, owners: dict | None = None) -> dict:
    """The node checks on SMI (and nvidia-smi -L's LISTED), with the collector's reading of who runs each GPU
    process (OWNERS: gpu_process_owners' answer) where given."""
    answer = {"rc": 0, "out": smi}
    if listed is not None:
        answer["list"] = {"rc": 0, "out": listed}
    raw = {"python": {"version": "3.11.2"}, "torch": dict(TORCH_CPU), "commands": {"nvidia_smi_q": answer}}
    if owners is not None:
        raw["gpu_processes"] = owners
    facts = collect.build(Node(name="gpu1", address="gpu1"), raw, python="/usr/bin/python3", python_source="test")
    facts = replace(facts, slurm_job=slurm_job)
    return {r.name: r for r in registry.run_node_checks(facts)}


def edited(text: str, line: str, value: str) -> str:
    """TEXT with the first `LINE : ...` line (key matched after its indentation) given VALUE."""
    pattern = re.compile(rf"^(\s*{re.escape(line)}\s*: ).*$", re.M)
    assert pattern.search(text), line
    return pattern.sub(lambda m: m.group(1) + value, text, count=1)


# What holds the GPU: used memory against the processes listed


def pod_memory() -> tuple[int, int]:
    """Used and total MiB of the GPU in microsoft/pai issue 2001's table (nvidia-smi in a job's container)."""
    used, total = re.search(r"(\d+)MiB / +(\d+)MiB", POD_TABLE).groups()
    assert "No running processes found" not in POD_TABLE and POD_TABLE.rstrip().endswith("=|")  # no process row
    return int(used), int(total)


def h200_as_pod_sees_it() -> str:
    """The real H200's nvidia-smi -q (no process) with its FB Memory Usage Total and Used set to the figures of the
    container's table (pai issue 2001): two lines edited, said here and in the data README."""
    used, total = pod_memory()
    return edited(edited(H200, "Total", f"{total} MiB"), "Used", f"{used} MiB")


def test_memory_in_use_with_no_process_listed_is_named_as_another_containers():
    """It was "no process on the GPUs" (PASS) while 11 GiB were in use."""
    result = judged(h200_as_pod_sees_it())["gpu.processes"]
    assert result.status is Status.WARN
    assert "another container or PID namespace holds 11.4 GiB on GPU 00000000:00:06.0" in result.message
    assert "nvidia-smi lists no process there" in result.message
    assert result.data["hidden_mib"] == {"00000000:00:06.0": 11637}
    assert "--pid=host" in result.remediation


def test_node_health_with_slurm_drains_a_node_whose_memory_no_listed_process_holds():
    idle = parse_show_node((DATA / "slurm" / "show-nodes-slurm-doc-mcs.txt").read_text(), "node0001")
    raw = json.loads(json.dumps(H200_RECORD))
    raw["commands"]["nvidia_smi_q"]["out"] = h200_as_pod_sees_it()
    results = health.judge(Node(name="gpu1", address="localhost"), raw, python="p", source="s", slurm_job=False)
    leftover = {r.name: r for r in results}["gpu.processes"]
    assert leftover.status is Status.FAIL
    assert leftover.message.startswith("gpu1: leftover: no Slurm job runs on this node, yet memory of no listed")
    assert "another container or PID namespace holds 11.4 GiB" in leftover.message
    action = decide(idle, results)
    assert action is not None and action.state == "drain" and "gpu.processes: leftover" in action.reason


def test_idle_gpus_and_a_process_holding_its_memory_are_not_taken_for_hidden_memory():
    """Used 0 MiB with the reserved memory apart (H200, H800), and the A10G's one process holding 8716 of the 8722
    MiB in use: nothing hidden."""
    for smi in (H200, H800):
        assert judged(smi)["gpu.processes"].status is Status.PASS
    result = judged(A10G)["gpu.processes"]
    assert result.data["hidden_mib"] == {} and "another container" not in result.message
    # and the hidden share is the used memory less what the listed process holds
    gpu = smi_parse.parse_nvidia_smi_q(edited(A10G, "Used", "30000 MiB")).gpus[0]
    assert gpu.unaccounted_mib == 30000 - 8716
    assert "holds 20.8 GiB on GPU 00000000:00:1E.0 (nvidia-smi lists processes holding less)" in (
        judged(edited(A10G, "Used", "30000 MiB"))["gpu.processes"].message
    )


# MIG


def mig_h200(pending: str = "Enabled", current: str = "Enabled") -> str:
    """The real H200's nvidia-smi -q with its MIG Mode lines set, and its GPU UUID set to the A100's that
    datadog-agent PR 33120's nvidia-smi -L lists (so the list's MIG devices belong to it): edits said here."""
    uuid = smi_parse.parse_nvidia_smi_list(MIG_LIST)[0][0]
    smi = edited(H200, "GPU UUID", uuid)
    return smi.replace(
        "MIG Mode\n        Current                                        : Disabled\n"
        "        Pending                                        : Disabled",
        f"MIG Mode\n        Current                                        : {current}\n"
        f"        Pending                                        : {pending}",
    )


def test_nvidia_smi_list_gives_each_gpus_mig_devices():
    listed = smi_parse.parse_nvidia_smi_list(MIG_LIST)
    uuid, devices = listed[0]
    assert uuid == "GPU-7fdaf0a5-179b-f636-d15d-daf243e3ff16"
    assert [d.profile for d in devices] == ["1g.10gb"] * 7 and devices[6].index == 6
    assert devices[0].uuid == "MIG-feb88891-0321-5fef-9c87-d4af3b54259e"


def test_a_gpu_with_mig_on_is_named_with_its_mig_devices():
    """There was no MIG check: a node whose GPU is cut into seven slices passed as eight whole GPUs would."""
    smi = mig_h200()
    assert "Enabled" in smi and smi_parse.parse_nvidia_smi_q(smi).gpus[0].mig
    result = judged(smi, MIG_LIST)["gpu.mig"]
    assert result.status is Status.WARN
    assert "MIG is on for 00000000:00:06.0: 7 MIG device(s): 7 x 1g.10gb" in result.message
    assert "no peer access over PCIe or NVLink" in result.message
    assert "-mig 0" in result.remediation
    assert result.data["devices"]["00000000:00:06.0"][0]["profile"] == "1g.10gb"


def test_a_pending_mig_change_and_mig_off_and_no_mig_at_all():
    pending = judged(mig_h200(pending="Enabled", current="Disabled"), MIG_LIST)["gpu.mig"]
    assert pending.status is Status.WARN
    assert "MIG mode change pending on 00000000:00:06.0 (current Disabled, pending Enabled)" in pending.message
    assert judged(H200)["gpu.mig"].status is Status.PASS  # MIG Mode: Disabled
    assert judged(A10G)["gpu.mig"].status is Status.SKIP  # MIG Mode: N/A (no MIG on an A10G)


def test_gpu_memory_says_mig_is_on_where_a_mig_gpu_reports_less():
    """The H200 record's FB Memory Total lowered too (a third edit, said here): the WARN names MIG and its devices
    instead of offering only "another variant" as the cause."""
    result = judged(edited(mig_h200(), "Total", "70000 MiB"), MIG_LIST)["gpu.memory"]
    assert result.status is Status.WARN
    assert "MIG is on for 00000000:00:06.0 (7 MIG device(s): 7 x 1g.10gb)" in result.message


# ECC: SRAM parity


def test_an_sram_uncorrectable_parity_error_fails_gpu_ecc():
    """The volatile `SRAM Uncorrectable Parity` count of the H200 record set to 2 (edited, said here): it was left
    out of the count (PASS); NVML counts parity errors among the uncorrectable ones."""
    smi = edited(H200, "SRAM Uncorrectable Parity", "2")
    assert smi_parse.parse_nvidia_smi_q(smi).gpus[0].ecc_uncorrected == 2
    result = judged(smi)["gpu.ecc"]
    assert result.status is Status.FAIL and "00000000:00:06.0: 2" in result.message


# Persistence mode


def test_persistence_off_warns_with_the_daemon_fix_that_works_on_ubuntu():
    """The A10G record has Persistence Mode: Disabled. The fix was `systemctl enable --now nvidia-persistenced`,
    which on Ubuntu starts the packaged unit with --no-persistence-mode and leaves it off."""
    result = judged(A10G)["gpu.persistence"]
    assert "--no-persistence-mode" in result.remediation and "nvidia-smi -pm 1" in result.remediation
    assert result.status is Status.WARN
    assert "persistence mode is off on 1 of 1 GPU(s) (00000000:00:1E.0)" in result.message
    assert "driver-persistence" in result.remediation  # NVIDIA's guide, cited
    assert judged(H200)["gpu.persistence"].status is Status.PASS


# nvidia-smi -q read GPU by GPU


def test_one_long_nvidia_smi_q_loses_its_head_and_per_gpu_outputs_joined_keep_it(monkeypatch, tmp_path):
    """Three real outputs (H200, H800, A10G) one after the other are what one `nvidia-smi -q` of a node with those
    GPUs prints; with the probe's limit below their length (lowered here: three GPUs stand for eight with MIG on),
    the kept tail has no driver line and no first GPU. Joined from per-GPU outputs, nothing is lost."""
    whole = H200 + H800[H800.index("GPU 0000") :] + A10G[A10G.index("GPU 0000") :]
    (tmp_path / "whole.txt").write_text(whole)
    monkeypatch.setattr(probing, "OUTPUT_LIMIT", len(whole) - len(H200) // 2)
    cut = smi_parse.parse_nvidia_smi_q(probing.run(["cat", str(tmp_path / "whole.txt")])["out"])
    assert cut.driver is None and len(cut.gpus) == 2  # the head, with the H200, is gone
    smi = smi_parse.parse_nvidia_smi_q(node.joined_smi_q([H200, H800, A10G]))
    assert smi.driver == "580.159.04" and smi.cuda == "13.0"
    assert [g.name for g in smi.gpus] == ["NVIDIA H200", "NVIDIA H800", "NVIDIA A10G"]
    assert [len(g.processes) for g in smi.gpus] == [0, 0, 1]


def fake_nvidia_smi(tmp_path: Path, monkeypatch) -> Path:
    """nvidia-smi on PATH answering -L with the recorded MIG list and -q -i 0 with the recorded H200 output; each
    call logged."""
    (tmp_path / "list.txt").write_text(MIG_LIST)
    (tmp_path / "q.txt").write_text(H200)
    tool = tmp_path / "bin" / "nvidia-smi"
    tool.parent.mkdir()
    tool.write_text(
        f'#!/bin/sh\necho "$@" >> {tmp_path}/calls\n'
        f'case "$*" in\n  -L) cat {tmp_path}/list.txt ;;\n  "-q -i 0") cat {tmp_path}/q.txt ;;\n'
        '  *) echo "unexpected: $*" >&2; exit 2 ;;\nesac\n'
    )
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")
    return tmp_path / "calls"


@pytest.mark.skipif(os.name != "posix", reason="the fake nvidia-smi is a shell script")
def test_the_collector_lists_the_gpus_then_reads_each_one(monkeypatch, tmp_path):
    calls = fake_nvidia_smi(tmp_path, monkeypatch)
    answer = node.nvidia_smi_q(10.0)
    assert calls.read_text().splitlines() == ["-L", "-q -i 0"]
    assert answer["rc"] == 0 and answer["gpu_errors"] == {} and answer["out"] == H200
    smi = smi_parse.parse_nvidia_smi_q(answer["out"])
    smi_parse.add_mig_devices(smi, smi_parse.parse_nvidia_smi_list(answer["list"]["out"]))
    assert smi.driver == "580.159.04" and smi.gpus[0].mig_devices == []  # the list's A100 is not this H200


@pytest.mark.skipif(os.name != "posix", reason="the fake nvidia-smi is a shell script")
def test_a_gpu_whose_own_call_fails_is_named_and_without_a_list_plain_q_answers(monkeypatch, tmp_path):
    fake_nvidia_smi(tmp_path, monkeypatch)
    (tmp_path / "q.txt").write_text("")  # -q -i 0 prints nothing
    answer = node.nvidia_smi_q(10.0)
    assert answer["rc"] == 1 and answer["err"].startswith("GPU 0: ")
    (tmp_path / "list.txt").write_text("")  # -L names no GPU: plain -q, which the fake refuses
    answer = node.nvidia_smi_q(10.0)
    assert answer["rc"] == 2 and "unexpected: -q" in answer["err"]


def test_a_gpu_whose_own_nvidia_smi_q_failed_fails_gpu_count_by_name():
    """The collector's answer when GPU 1's `nvidia-smi -q -i 1` timed out and GPU 0 (the H200 record) answered."""
    answer = {"rc": 0, "out": H200, "gpu_errors": {"1": "nvidia-smi timed out after 10 s"}}
    raw = {"python": {"version": "3.11.2"}, "torch": dict(TORCH_CPU), "commands": {"nvidia_smi_q": answer}}
    facts = collect.build(Node(name="gpu1", address="gpu1"), raw, python="/usr/bin/python3", python_source="test")
    result = {r.name: r for r in registry.run_node_checks(facts)}["gpu.count"]
    assert result.status is Status.FAIL
    assert "nvidia-smi -q failed for the others: GPU 1: nvidia-smi timed out after 10 s" in result.message
    assert "Xid 79" in result.remediation


# Another clustercheck run's ranks on the GPUs


def test_a_rank_of_another_clustercheck_run_is_named_as_that_run_not_a_stranger_s_leftover(tmp_path):
    """The node side tells a process of a clustercheck run by its markers (the leftovers sweep's); gpu.processes then
    names that run and says to wait, never to kill it, also under node-health --slurm with no Slurm job."""
    import subprocess
    import sys

    env = {**os.environ, probing.RUN_MARKER: "3f2a9c", probing.UNTIL_MARKER: "4102444800"}
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        owners = node.gpu_process_owners({"out": f"        Process ID                        : {rank.pid}\n"})
    finally:
        rank.kill()
        rank.wait()
    job = owners[str(rank.pid)]["clustercheck_run"]
    assert job["run"] == "3f2a9c" and job["until"] == 4102444800
    pid = re.search(r"Process ID\s*: (\d+)", A10G)[1]
    mine = {pid: {**owners[str(rank.pid)], "name": "python"}}
    for slurm_job in (None, False):
        result = judged(A10G, slurm_job=slurm_job, owners=mine)["gpu.processes"]
        assert result.status is Status.WARN, result.message
        assert "another clustercheck run" in result.message and "run 3f2a9c" in result.message
        assert "kill" not in result.remediation and "Wait for that run" in result.remediation
    stranger = {pid: {"uid": 1000, "user": "alice", "name": "python"}}
    assert judged(A10G, slurm_job=False, owners=stranger)["gpu.processes"].status is Status.FAIL
