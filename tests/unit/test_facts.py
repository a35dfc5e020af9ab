"""Parsers of the facts collector's raw outputs, on recorded outputs; every declared fact against the node side
and the recorded collector outputs."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from clustercheck.facts import collect, model
from clustercheck.facts import parse as facts
from clustercheck.facts import smi as smi_parse
from clustercheck.inventory import Node
from clustercheck.remote import facts as node

DATA = Path(__file__).parent / "data"
RECORDS = sorted((Path(__file__).parent / "records").glob("facts-*.json"))  # the collector's output on real nodes
H800 = (DATA / "nvidia-smi-q-h800.txt").read_text()


def test_nvidia_smi_q_of_a_real_h800():
    smi = smi_parse.parse_nvidia_smi_q(H800)
    assert smi.driver == "525.105.17"
    assert smi.cuda == "12.0"
    assert len(smi.gpus) == 1  # -q -i 0: one of the eight GPUs
    gpu = smi.gpus[0]
    assert gpu.bus_id == "00000000:18:00.0"
    assert gpu.name == "NVIDIA H800"
    assert gpu.persistence == "Enabled"
    assert gpu.ecc_uncorrected is None  # ECC off: every counter N/A
    assert gpu.throttle_active == []  # "Idle: Active" is normal
    assert (gpu.fabric_state, gpu.fabric_status) == ("Completed", "Success")
    assert gpu.processes == []


def derived(*replacements: tuple[str, str]) -> str:
    """The recorded output with single lines edited (stated in each test)."""
    text = H800
    for old, new in replacements:
        assert old in text
        text = text.replace(old, new, 1)
    return text


def test_hardware_slowdown_ecc_and_processes_are_seen():
    text = derived(
        ("HW Thermal Slowdown           : Not Active", "HW Thermal Slowdown           : Active"),
        ("DRAM Uncorrectable            : N/A", "DRAM Uncorrectable            : 2"),
        (
            "    Processes                             : None",
            "    Processes\n        GPU instance ID                   : N/A\n"
            "        Process ID                        : 4242\n            Type                          : C\n"
            "            Name                          : python",
        ),
    )
    gpu = smi_parse.parse_nvidia_smi_q(text).gpus[0]
    assert gpu.throttle_active == ["HW Thermal Slowdown"]
    assert gpu.ecc_uncorrected == 2
    assert [(p.pid, p.type, p.name, p.used_mib) for p in gpu.processes] == [(4242, "C", "python", None)]


def test_two_gpus_are_two_entries():
    first_gpu = H800[H800.index("GPU 00000000:18:00.0") :]
    text = H800 + first_gpu.replace("00000000:18:00.0", "00000000:2A:00.0")
    assert [g.bus_id for g in smi_parse.parse_nvidia_smi_q(text).gpus] == ["00000000:18:00.0", "00000000:2A:00.0"]


def test_xid_lines_of_the_kernel_log():
    log = (
        "2024-05-01T10:00:00+0000 gpu01 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
        "2024-05-01T10:00:01+0000 gpu01 kernel: eth0: link up\n"
        "2024-05-01T10:00:02+0000 gpu01 kernel: NVRM: Xid (PCI:0000:86:00): 48, pid=1234, "
        "An uncorrectable double bit error\n"
    )
    assert [(x["pci"], x["xid"]) for x in facts.parse_xids(log)] == [("PCI:0000:3b:00", 79), ("PCI:0000:86:00", 48)]


def test_chrony_tracking_offset_sign():
    tracking = (
        "Reference ID    : C0A80001 (192.168.0.1)\nStratum         : 3\n"
        "System time     : 0.000123456 seconds slow of NTP time\nLeap status     : Normal\n"
    )
    info = facts.parse_chronyc_tracking(tracking)
    assert info["leap_status"] == "Normal"
    assert info["offset_s"] == -0.000123456


def test_cluster_interface_is_picked_by_name_cidr_address_then_route():
    addr = (
        "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever\n"
        "2: eth0    inet 172.30.81.11/24 brd 172.30.81.255 scope global eth0\\       valid_lft forever\n"
        "3: ib0    inet 10.10.0.11/16 brd 10.10.255.255 scope global ib0\\       valid_lft forever\n"
    )
    entries = facts.parse_ip_addr(addr)
    route = "1.1.1.1 via 172.30.81.1 dev eth0 src 172.30.81.11 uid 0 \\    cache"
    assert facts.pick_interface(entries, route, "ens5", None, None)[0] == "ens5"
    assert facts.pick_interface(entries, route, None, "10.10.0.0/16", "172.30.81.11")[0] == "ib0"
    assert facts.pick_interface(entries, route, None, None, "172.30.81.11")[0] == "eth0"
    assert facts.pick_interface(entries, route, None, None, "gpu01.example")[0] == "eth0"


def test_torch_and_its_cuda_version_are_read_from_torch_version_py_without_an_import():
    from clustercheck.remote.torchprobe import parse_torch_version_file

    def read(name: str) -> dict:
        return parse_torch_version_file((DATA / "torch-version" / name).read_text())

    assert read("2.13.0-cpu-wheel.txt") == {"version": "2.13.0+cpu", "cuda": None}  # a CPU build
    assert read("2.7.1-cuda-12.9-source-build.txt") == {"version": "2.7.1-700", "cuda": "12.9"}
    assert read("1.3.1-cuda-10.1.txt") == {"version": "1.3.1", "cuda": "10.1"}  # the form without a type
    assert parse_torch_version_file("") == {}  # nothing known: the import tells


def test_the_node_side_and_the_controller_agree_on_every_facts_key():
    """Each probe the node side declares (@fact) fills exactly one NodeFacts field, and each declared field names
    a declared probe: a fact added on one side only fails here."""
    keys = [declaration.key for declaration in model.declared().values()]
    assert sorted(keys) == sorted(node.PROBES)
    assert "memlock" in keys and model.declared()["memlock"].probe is node.memlock


def built(path: Path) -> model.NodeFacts:
    return collect.build(
        Node(name="node1", address="node1"), json.loads(path.read_text()), python="python3", python_source="python3"
    )


@pytest.mark.parametrize("name", sorted(model.declared()))
def test_every_declared_fact_is_read_from_a_recorded_collector_output(name):
    """A declared fact has recorded test data: a real collector output (tests/unit/records/README.md) that holds
    its key, and its parser reads every recorded value that is not a probe's error."""
    key = model.declared()[name].key
    holding = [path for path in RECORDS if key in json.loads(path.read_text())]
    assert holding, f"no recorded collector output holds {key!r} (tests/unit/records/facts-*.json)"
    for path in holding:
        value = json.loads(path.read_text())[key]
        if isinstance(value, dict) and set(value) == {"error"}:
            continue
        found = built(path)
        assert name not in found.missing, (path.name, found.missing[name])


def test_a_probe_that_failed_is_missing_with_its_error_and_an_unreadable_value_could_not_be_collected():
    raw = json.loads(RECORDS[0].read_text())
    raw["memlock"] = {"error": "OSError: [Errno 1] Operation not permitted"}  # what probe() records
    raw["shm"] = "not an object"
    del raw["os"]
    found = collect.build(Node(name="node1", address="node1"), raw, python="python3", python_source="python3")
    assert found.memlock is None
    assert found.missing["memlock"] == "OSError: [Errno 1] Operation not permitted"  # verbatim: the error raised
    assert found.shm is None and found.missing["shm"] == model.COULD_NOT_COLLECT
    assert found.os is None and found.missing["os"] == model.COULD_NOT_COLLECT


def test_the_node_side_collector_needs_only_the_standard_library():
    """remote/facts.py runs on each node's own python (as old as Ubuntu 20.04's 3.8) from the uploaded bundle:
    it and the modules of the bundle it imports (from . import ...) import nothing beyond the standard library,
    and nothing of the controller's."""
    imported, seen, todo = set(), set(), [Path(node.__file__)]
    while todo:
        path = todo.pop()
        seen.add(path)
        tree = ast.parse(path.read_text())
        imported |= {alias.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for alias in n.names}
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.level == 0:
                imported.add(n.module.split(".")[0])
            elif isinstance(n, ast.ImportFrom):  # a module of the bundle: its own imports count too
                sibling = path.parent / f"{n.module}.py"
                assert n.level == 1 and sibling.exists(), ast.dump(n)
                if sibling not in seen:
                    todo.append(sibling)
    assert len(seen) > 1  # the collector's own modules were followed
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)
