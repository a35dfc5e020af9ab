"""The GPU itself, on recorded outputs: each Xid of the kernel log judged by NVIDIA's Xid catalog, who holds the GPUs
(pid, name, user, memory) and whether node-health --slurm takes a leftover as a reason to drain the node."""

from __future__ import annotations

import json
import os
import pwd
from dataclasses import replace
from pathlib import Path

import pytest
from wording import says

from clustercheck.checks import registry, xid_catalog
from clustercheck.facts import collect
from clustercheck.facts import smi as smi_parse
from clustercheck.inventory import Node
from clustercheck.model import Status
from clustercheck.remote import facts as node
from clustercheck.remote.probing import matching_lines
from clustercheck.run import health
from clustercheck.slurm.drain import decide
from clustercheck.slurm.parse import parse_show_node

DATA = Path(__file__).parent / "data"
RECORDS = Path(__file__).parent / "records"
A10G = (DATA / "nvidia-smi-q-a10g-process-dcgm-232.txt").read_text()
TORCH_CPU = {"version": "2.13.0+cpu", "cuda": None, "cuda_available": False, "device_count": 0, "gloo": True}


def xids_of(name: str) -> dict:
    """The collector's Xid probe run on a recorded kernel log (the node-side search, over `cat FILE`)."""
    answer = matching_lines(["cat", str(DATA / "xid" / name)], node.XID_MARKS)
    return {**answer, "source": "journalctl -k -b"}


def judged(smi: str | None = None, xids: dict | None = None, owners: dict | None = None) -> dict:
    commands = {"nvidia_smi_q": {"rc": 0, "out": smi} if smi else {"error": "nvidia-smi not found"}}
    if xids is not None:
        commands["xids"] = xids
    raw = {"python": {"version": "3.11.2"}, "torch": dict(TORCH_CPU), "commands": commands}
    if owners is not None:
        raw["gpu_processes"] = owners
    facts = collect.build(
        Node(name="gpu1", address="gpu1", gpus_expected=1), raw, python="/usr/bin/python3", python_source="test"
    )
    return {r.name: r for r in registry.run_node_checks(facts)}


# Xid: NVIDIA's catalog


def test_the_catalog_covers_the_hardware_and_application_codes_and_takes_out_the_hardwares():
    """NVIDIA's buckets: 63 and 92 IGNORE, 94 RESTART_APP (tests/unit/test_xid.py holds every row to its table)."""
    for code in (48, 64, 74, 79, 95, 109, 119, 120):
        entry = xid_catalog.lookup(code)
        assert entry is not None and entry.takes_out, code
    for code in (13, 31, 43, 45):
        entry = xid_catalog.lookup(code)
        assert entry is not None and entry.cause == xid_catalog.APPLICATION and not entry.takes_out, code
    for code in (63, 92, 94):
        assert not xid_catalog.lookup(code).takes_out, code
    for entry in xid_catalog.CATALOG.values():
        assert entry.action in xid_catalog.ACTIONS and entry.name
        assert entry.cause in (xid_catalog.APPLICATION, xid_catalog.DRIVER, xid_catalog.HARDWARE)
    assert xid_catalog.lookup(79).action == xid_catalog.REBOOT  # NVIDIA: RESTART_BM
    assert xid_catalog.lookup(185) is None  # a code newer than the catalog


def test_a_gpu_that_fell_off_the_bus_fails_with_a_reboot():
    """Xid 79 was a WARN like any other Xid; NVIDIA's action for it is to restart the machine."""
    result = judged(H200_SMI, xids_of("xid79-open-gpu-kernel-modules-1151.log"))["gpu.xid"]
    assert result.status is Status.FAIL
    assert "Xid 79 (GPU has fallen off the bus; cause: hardware) 1 time(s) on PCI:0000:2b:00" in result.message
    assert "drain the node and reboot it" in result.message
    assert result.remediation.startswith("Xid 79: drain the node and reboot it")
    assert xid_catalog.CATALOG_URL in result.remediation


def test_a_double_bit_ecc_error_fails_with_a_gpu_reset():
    result = judged(H200_SMI, xids_of("xid48-gpu-operator-1146.log"))["gpu.xid"]
    assert result.status is Status.FAIL
    assert "Xid 48 (Double Bit ECC Error; cause: hardware) 1 time(s) on PCI:0000:07:00" in result.message
    assert result.remediation.startswith("Xid 48: drain the node and reset the GPU")


def test_a_row_marked_for_remapping_warns_and_leaves_the_pending_remap_to_gpu_remapped_rows():
    """NVIDIA's bucket for Xid 63 is IGNORE: the remap pending until a reset is what gpu.remapped_rows judges."""
    result = judged(H200_SMI, xids_of("xid63-ml-engineering.log"))["gpu.xid"]
    assert result.status is Status.WARN and "Xid 63 (GPU memory remapping event" in result.message
    assert "gpu.remapped_rows" in result.message


def test_application_xids_and_a_contained_memory_error_beside_them_warn():
    """dmesg of a node whose jobs hit Xid 43 twice and Xid 31, and one GPU a contained memory error (Xid 94, which
    NVIDIA's catalog answers with RESTART_APP)."""
    result = judged(H200_SMI, xids_of("xid43-31-94-akash-support-244.log"))["gpu.xid"]
    assert result.status is Status.WARN
    assert "4 Xid error(s) since the driver loaded at Sun Jul 28 09:15:27 2024 (journalctl -k -b)" in result.message
    assert (
        "Xid 31 (GPU memory page fault; cause: application) 1 time(s) on PCI:0000:00:07 at Mon Aug 5 03:54:13 2024: "
        "restart the application" in result.message
    )
    assert "Xid 43 (GPU stopped processing; cause: application) 2 time(s) on PCI:0000:00:05 first at" in (
        result.message
    )
    assert "Xid 94 (Contained memory error; cause: hardware)" in result.message
    assert "NVIDIA advises resetting the GPU when convenient" in result.message
    assert result.data["xids"][43]["action"] == "none" and result.data["xids"][94]["nvidia"] == "RESTART_APP"


def test_an_application_xid_warns_and_a_context_switch_timeout_fails_with_a_gpu_reset():
    """Xid 109 was missing from the catalog (an unknown WARN); NVIDIA's bucket for it is RESET_GPU."""
    result = judged(H200_SMI, xids_of("xid13-109-gpud-46.log"))["gpu.xid"]
    assert result.status is Status.FAIL
    assert "Xid 13 (Graphics Engine Exception; cause: application) 3 time(s) on PCI:0000:cb:00" in result.message
    assert "Xid 109 (ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR; cause: driver) 1 time(s) on PCI:0000:cb:00" in (result.message)
    assert result.remediation.startswith("Xid 109: drain the node and reset the GPU")


def test_a_code_the_catalog_lacks_warns_naming_it(monkeypatch):
    """The same log with 109 taken out of the catalog: a code newer than clustercheck's copy."""
    monkeypatch.delitem(xid_catalog.CATALOG, 109)
    result = judged(H200_SMI, xids_of("xid13-109-gpud-46.log"))["gpu.xid"]
    assert result.status is Status.WARN
    assert "Xid 109 (1 time(s) on PCI:0000:cb:00 at Fri Aug 30 11:43:14 2024): not in clustercheck's copy" in (
        result.message
    )
    assert "drain" not in result.remediation and xid_catalog.CATALOG_URL in result.remediation


def test_no_xid_since_boot_passes_and_names_the_log_read():
    result = judged(H200_SMI, {"rc": 0, "lines": [], "read": 1234, "source": "dmesg"})["gpu.xid"]
    assert result.status is Status.PASS and says(result.message, "gpu1: ", "no Xid", "dmesg", "1234 line(s)")


def test_the_xid_probe_falls_back_to_dmesg_and_names_it(monkeypatch):
    log = str(DATA / "xid" / "xid79-open-gpu-kernel-modules-1151.log")
    monkeypatch.setattr(node, "KERNEL_LOGS", (["true"], ["cat", log]))  # journalctl answering nothing, then the log
    answer = node.xid_lines(5)
    assert answer["source"] == f"cat {log}" and answer["read"] == 3
    line = "May 18 19:02:39 kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus."
    assert answer["lines"][1] == line  # verbatim: the log's line, as read
    assert answer["lines"][0].endswith("NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae")
    monkeypatch.setattr(node, "KERNEL_LOGS", (["true"], ["false"]))
    assert "error" in node.xid_lines(5)


def test_node_health_drains_on_a_hardware_xid():
    """The real H200's collector record with the Xid 79 lines in its kernel log (the one value edited)."""
    raw = h200_raw()
    raw["commands"]["xids"] = xids_of("xid79-open-gpu-kernel-modules-1151.log")
    results = health.judge(Node(name="gpu1", address="localhost"), raw, python="p", source="s")
    action = decide(parse_show_node(slurm_recorded("show-nodes-slurm-doc-mcs.txt"), "node0001"), results)
    assert action is not None and action.state == "drain"
    assert action.reason.startswith("clustercheck: gpu.xid: 1 Xid error(s) since boot (journalctl -k -b): Xid 79")


# Who is on the GPU


def test_each_process_of_nvidia_smi_q_is_read_with_its_memory():
    gpu = smi_parse.parse_nvidia_smi_q(A10G).gpus[0]
    assert [(p.pid, p.type, p.name, p.used_mib) for p in gpu.processes] == [(3402470, "C", None, 8716)]
    assert gpu.memory_total_mib == 23028


def test_a_process_is_named_with_its_user_memory_and_share_of_the_gpu():
    """It was "1 process(es) already use the GPUs (pid 3402470)": no memory, no name, no owner."""
    owners = {"3402470": {"uid": 1001, "user": "alice", "name": "python3", "command": "python3 train.py"}}
    result = judged(A10G, owners=owners)["gpu.processes"]
    assert result.status is Status.WARN
    assert (
        "pid 3402470 python3 (user alice) holds 8.5 GiB of GPU 00000000:00:1E.0 (38% of its memory)" in result.message
    )
    assert result.data["processes"] == [
        {
            "gpu": "00000000:00:1E.0",
            "pid": 3402470,
            "name": "python3",
            "user": "alice",
            "type": "C",
            "used_mib": 8716,
            "share": 0.3785,
            "command": "python3 train.py",
        }
    ]


def test_a_process_the_collector_cannot_see_says_why_its_owner_is_unknown():
    owners = {"3402470": {"error": "no such process here (it ended, or runs in another PID namespace)"}}
    message = judged(A10G, owners=owners)["gpu.processes"].message
    assert "pid 3402470 (no name) (user unknown: no such process here" in message


def test_the_collector_reads_a_gpu_processs_owner_from_proc():
    """This test's own process, listed as nvidia-smi -q lists one, and a pid that does not exist."""
    smi = {"rc": 0, "out": f"    Processes\n        Process ID                        : {os.getpid()}\n"}
    mine = node.gpu_process_owners(smi)[str(os.getpid())]
    assert mine["user"] == pwd.getpwuid(os.getuid()).pw_name and mine["uid"] == os.getuid()
    assert mine["name"] and mine["command"]
    gone = node.gpu_process_owners({"out": "        Process ID                        : 999999999\n"})
    assert "no such process here" in gone["999999999"]["error"]


def test_node_health_with_slurm_drains_a_node_whose_gpu_is_held_by_a_leftover():
    """The real H200's record with the A10G record's process lines in its Processes section (edited, said here): no
    job runs on the node (Slurm's documentation's idle node), so the process is a leftover: FAIL, and a drain."""
    raw = h200_raw()
    smi = raw["commands"]["nvidia_smi_q"]["out"]
    processes = A10G[A10G.index("    Processes\n") :]
    raw["commands"]["nvidia_smi_q"]["out"] = smi.replace(
        "    Processes                                          : None\n", processes
    )
    raw["gpu_processes"] = {"3402470": {"uid": 0, "user": "root", "name": "python3"}}
    idle = parse_show_node(slurm_recorded("show-nodes-slurm-doc-mcs.txt"), "node0001")
    assert idle.runs_job is False
    results = health.judge(Node(name="gpu1", address="localhost"), raw, python="p", source="s", slurm_job=False)
    leftover = {r.name: r for r in results}["gpu.processes"]
    assert leftover.status is Status.FAIL
    assert leftover.message.startswith("gpu1: leftover: no Slurm job runs on this node, yet 1 process(es) hold")
    assert "pid 3402470 python3 (user root) holds 8.5 GiB of GPU 00000000:" in leftover.message
    assert "(6% of its memory)" in leftover.message  # 8716 MiB of the H200's 143771
    action = decide(idle, results)
    assert action is not None and action.state == "drain" and "gpu.processes: leftover" in action.reason


def test_while_a_slurm_job_runs_a_process_on_the_gpu_is_the_jobs():
    busy = parse_show_node(slurm_recorded("show-node-slurmd-stopped.txt"), "node3")  # in an allocation: MIXED
    assert busy.runs_job is True
    owners = {"3402470": {"uid": 1001, "user": "alice", "name": "python3"}}
    facts = collect.build(
        Node(name="gpu1", address="gpu1", gpus_expected=1),
        {
            "python": {},
            "torch": dict(TORCH_CPU),
            "commands": {"nvidia_smi_q": {"rc": 0, "out": A10G}},
            "gpu_processes": owners,
        },
        python="p",
        python_source="s",
    )
    facts = replace(facts, slurm_job=True)
    result = {r.name: r for r in registry.run_node_checks(facts)}["gpu.processes"]
    assert result.status is Status.PASS
    assert result.message.startswith("gpu1: 1 process(es) of the Slurm job running on this node: pid 3402470")


def test_node_health_asks_slurm_once_for_both_the_job_and_the_drain(monkeypatch):
    asked = []
    idle = parse_show_node(slurm_recorded("show-nodes-slurm-doc-mcs.txt"), "node0001")
    monkeypatch.setattr(health.update, "node_state", lambda name, say, timeout: asked.append(name) or idle)
    state = health.SlurmState("node0001", print, lambda: 1.0)
    assert state.job_runs() is False
    assert state.read() is idle and asked == ["node0001"]


H200_RECORD = RECORDS / "facts-h200-vm.json"
H200_SMI = json.loads(H200_RECORD.read_text())["commands"]["nvidia_smi_q"]["out"]


def h200_raw() -> dict:
    return json.loads(H200_RECORD.read_text())


def slurm_recorded(name: str) -> str:
    return (DATA / "slurm" / name).read_text()


@pytest.fixture(autouse=True)
def _no_scontrol_here(monkeypatch):
    """No test here runs Slurm's commands."""
    monkeypatch.setattr(health.update, "call", None)


# GPUs hidden by the environment


def hidden_h200(visibility: dict) -> dict:
    """The real H200's record, its torch answer what CUDA answers when CUDA_VISIBLE_DEVICES names no GPU of the
    node (cuda_available False, no device) and its gpu_visibility the one recorded with CUDA_VISIBLE_DEVICES=1 (set in
    the environment and in the login user's ~/.bashrc, facts-cuda-visible-devices-localhost.json): two values of the
    record changed, said here."""
    raw = h200_raw()
    raw["torch"] = {**raw["torch"], "cuda_available": False, "device_count": 0, "nccl": None, "cudnn": None}
    raw["gpu_visibility"] = visibility
    return {r.name: r for r in health.judge(Node(name="gpu1", address="localhost"), raw, python="p", source="s")}


def recorded_visibility() -> dict:
    return json.loads((RECORDS / "facts-cuda-visible-devices-localhost.json").read_text())["gpu_visibility"]


def test_a_gpu_hidden_by_cuda_visible_devices_is_named_as_the_cause_not_the_torch_build():
    """It was "torch.cuda.is_available() is False" with the fix "Install the CUDA build of torch"."""
    result = hidden_h200(recorded_visibility())["torch.cuda"]
    assert result.status is Status.FAIL
    assert says(result.message, "gpu1: ", "torch sees 0 of the 1 GPU(s)", "CUDA_VISIBLE_DEVICES='1'")
    assert says(result.message, "/tmp/gpuwork/home/.bashrc:2", "names no GPU", "it has GPU 0")
    assert result.remediation.startswith("Unset CUDA_VISIBLE_DEVICES in /tmp/gpuwork/home/.bashrc")
    assert "Install the CUDA build" not in result.remediation
    assert result.data["set_in"] == {"CUDA_VISIBLE_DEVICES": ["/tmp/gpuwork/home/.bashrc:2"]}


def test_a_variable_set_by_whatever_started_the_collector_is_named_as_such():
    result = hidden_h200({"environment": {"CUDA_VISIBLE_DEVICES": "1"}, "files": {}})["torch.cuda"]
    assert "CUDA_VISIBLE_DEVICES='1' (in the environment the collector ran in)" in result.message
    assert "the shell, service or SSH session that starts the jobs" in result.remediation


def test_without_the_variable_torch_not_seeing_the_gpu_keeps_its_own_cause():
    result = hidden_h200({"environment": {}, "files": {}})["torch.cuda"]
    assert result.status is Status.FAIL and result.message.startswith("gpu1: torch.cuda.is_available() is False")


def test_the_recorded_h200_sees_its_gpu_whatever_its_startup_files_say():
    raw = h200_raw()
    raw["gpu_visibility"] = recorded_visibility()
    results = {r.name: r for r in health.judge(Node(name="gpu1", address="localhost"), raw, python="p", source="s")}
    assert results["torch.cuda"].status is Status.PASS
