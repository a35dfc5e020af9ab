"""Per-node checks and cross-node consistency, judged on recorded facts."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

from wording import says

from clustercheck import report
from clustercheck.checks import consistency, registry, setup_roles, system
from clustercheck.facts import collect, parse
from clustercheck.facts.model import NeighThresholds, NodeFacts
from clustercheck.inventory import Node
from clustercheck.model import CheckResult, Status
from clustercheck.stages.core import settled

H800 = (Path(__file__).parent / "data" / "nvidia-smi-q-h800.txt").read_text()
TORCH_CPU = {"version": "2.13.0+cpu", "cuda": None, "cuda_available": False, "device_count": 0, "gloo": True}


def node_facts(name="node1", gpus_expected=None, smi=None, torch=None, cluster_size=3, **raw) -> NodeFacts:
    commands = {"nvidia_smi_q": {"rc": 0, "out": smi} if smi else {"error": "nvidia-smi not found"}}
    commands.update(raw.pop("commands", {}))
    return collect.build(
        Node(name=name, address=name, gpus_expected=gpus_expected),
        {"python": {"version": "3.11.2"}, "torch": torch or dict(TORCH_CPU), "commands": commands, **raw},
        python="/opt/clustercheck/venv/bin/python",
        python_source="/etc/clustercheck/python",
        cluster_size=cluster_size,
    )


def by_name(facts: NodeFacts) -> dict[str, CheckResult]:
    return {r.name: r for r in registry.run_node_checks(facts)}


def test_gpu_checks_skip_without_gpus_unless_expected():
    results = by_name(node_facts())
    assert all(results[n].status is Status.SKIP for n in ("gpu.count", "gpu.ecc", "torch.cuda"))
    expected = by_name(node_facts(gpus_expected=8))
    assert expected["gpu.count"].status is Status.FAIL
    assert "8 GPU(s) expected" in expected["gpu.count"].message
    assert expected["gpu.count"].remediation


def test_a_healthy_h800_passes_but_count_must_match():
    results = by_name(node_facts(gpus_expected=1, smi=H800))
    assert results["gpu.count"].status is Status.PASS
    assert results["gpu.driver"].message.endswith("driver 525.105.17, CUDA 12.0")
    assert results["gpu.persistence"].status is Status.PASS
    assert results["gpu.ecc"].status is Status.PASS
    assert results["gpu.throttle"].status is Status.PASS
    assert by_name(node_facts(gpus_expected=8, smi=H800))["gpu.count"].status is Status.FAIL


def test_cpu_torch_on_a_gpu_node_fails_with_the_cause():
    result = by_name(node_facts(gpus_expected=1, smi=H800))["torch.cuda"]
    assert result.status is Status.FAIL
    assert "CPU-only build" in result.message


def test_persistence_off_ecc_errors_and_xids():
    smi = H800.replace(
        "Persistence Mode                      : Enabled", "Persistence Mode                      : Disabled"
    )
    smi = smi.replace("DRAM Uncorrectable            : N/A", "DRAM Uncorrectable            : 3", 1)
    line = (Path(__file__).parent / "data" / "xid" / "xid79-open-gpu-kernel-modules-1151.log").read_text()
    xids = {"rc": 0, "lines": [x for x in line.splitlines() if "NVRM: Xid" in x], "read": 3, "source": "dmesg"}
    results = by_name(node_facts(smi=smi, commands={"xids": xids}))
    assert results["gpu.persistence"].status is Status.WARN
    assert results["gpu.ecc"].status is Status.FAIL and "00000000:18:00.0: 3" in results["gpu.ecc"].message
    assert results["gpu.xid"].status is Status.FAIL and "Xid 79" in results["gpu.xid"].message  # NVIDIA: reboot


def test_fabric_manager_is_checked_on_nvswitch_boards_only():
    assert by_name(node_facts(smi=H800))["gpu.fabricmanager"].status is Status.SKIP
    down = {"fabricmanager": {"rc": 3, "out": "inactive\n"}}
    result = by_name(node_facts(smi=H800, nvswitches=4, commands=down))["gpu.fabricmanager"]
    assert result.status is Status.FAIL and "inactive" in result.message
    up = {"fabricmanager": {"rc": 0, "out": "active\n"}}
    assert by_name(node_facts(smi=H800, nvswitches=4, commands=up))["gpu.fabricmanager"].status is Status.PASS


def test_a_probe_that_could_not_collect_is_said_so():
    results = by_name(node_facts(torch={"error": "ModuleNotFoundError: No module named 'torch'"}))
    assert results["torch.import"].status is Status.FAIL
    assert "No module named 'torch'" in results["torch.import"].message
    assert results["shm.size"].status is Status.WARN and "could not collect" in results["shm.size"].message


def test_hostname_on_loopback_fails_only_on_a_multi_node_cluster():
    loopback = {"hostname": "gpu01", "addresses": ["127.0.1.1"]}
    assert by_name(node_facts(hostname=loopback))["hostname.resolve"].status is Status.FAIL
    alone = by_name(node_facts(hostname=loopback, cluster_size=1))["hostname.resolve"]
    assert alone.status is Status.WARN
    # Why a one-node run warns where node-health fails, in the check's own words.
    assert "fine on one node (its ranks meet on 127.0.0.1), breaks rendezvous across nodes" in alone.message
    assert "(a FAIL in a run over several, and in node-health, which judges a node as one of a cluster's)" in (
        alone.message
    )


def test_the_loopback_fix_names_the_address_the_hostname_resolved_to():
    result = by_name(node_facts(hostname={"hostname": "gpu01", "addresses": ["127.0.0.1"]}))["hostname.resolve"]
    assert "127.0.0.1" in result.remediation and "127.0.1.1" not in result.remediation


def test_consistency_with_fewer_than_two_nodes_reached_says_how_many_of_how_many():
    def messages(nodes):
        results = registry.run_cluster_checks(nodes, None)
        return {r.message for r in results if r.name.startswith("consistency.")}

    assert messages([]) == {"no node reached, nothing to compare"}
    assert messages([node_facts(cluster_size=2)]) == {"1 of 2 nodes reached, nothing to compare"}
    assert messages([node_facts(cluster_size=1)]) == {"one node, nothing to compare"}


def test_what_no_node_reported_is_skipped_with_one_message_for_every_consistency_check():
    results = registry.run_cluster_checks([node_facts(name=f"n{i}") for i in range(3)], None)
    unknown = {r.name for r in results if r.message == "known on 0 of 3 nodes, nothing to compare"}
    assert {"consistency.cuda", "consistency.nccl", "consistency.driver", "consistency.vbios"} <= unknown  # CPU nodes
    assert {"consistency.packages", "consistency.clock"} <= unknown  # not collected in these facts


def test_consistency_names_the_nodes_that_differ_from_the_majority():
    result = consistency.compare({"n1": "2.13.0", "n2": "2.13.0", "n3": "2.12.0"}, "torch version")
    assert result.status is Status.FAIL
    assert says(result.message, "torch version differs", "n3 has 2.12.0", "other 2 node(s) have 2.13.0")
    assert result.data["differ"] == ["n3"]
    tie = consistency.compare({"n1": 1500, "n2": 9000}, "MTU")
    assert tie.status is Status.FAIL and "no majority" in tie.message
    assert consistency.compare({"n1": None, "n2": None}, "driver").status is Status.SKIP
    assert consistency.compare({"n1": "2.13.0"}, "torch").status is Status.SKIP


def test_consistency_checks_read_the_typed_facts_of_every_node():
    nodes = [node_facts(name=f"n{i}") for i in range(3)]
    nodes[2] = node_facts(name="n2", torch={**TORCH_CPU, "version": "2.12.0+cpu"})
    results = {r.name: r for r in registry.run_cluster_checks(nodes, None)}
    assert results["consistency.torch"].status is Status.FAIL
    assert "n2 has 2.12.0+cpu" in results["consistency.torch"].message
    assert results["consistency.torch"].remediation
    assert results["consistency.python"].status is Status.PASS


def test_clock_offsets_within_the_bound():
    offsets = (0.01, -0.02, 0.03)
    nodes = [replace(node_facts(name=f"n{i}"), clock_offset=offset) for i, offset in enumerate(offsets)]
    config = type("Config", (), {"clock_bound": 0.5})()
    assert consistency.clocks(nodes, config).status is Status.PASS
    nodes[2] = replace(nodes[2], clock_offset=2.0)
    late = consistency.clocks(nodes, config)
    assert late.status is Status.FAIL and "n2 is +1.990 s" in late.message
    offsets = {m.labels["host"]: (m.metric.name, m.value) for m in late.measures}  # typed, for the metrics
    assert offsets == {f"n{i}": ("clock_offset_seconds", o) for i, o in enumerate((0.01, -0.02, 2.0))}


def test_clock_offsets_read_over_slow_answers_differ_only_beyond_their_error():
    """Offsets as 64 srun steps started at once on a busy login node gave them (0.9 s apart, each read over an
    answer that took up to 2 s): not a difference; a clock 2 s off is one whatever the error."""
    nodes = [node_facts(name=f"n{i}") for i in range(3)]
    config = type("Config", (), {"clock_bound": 0.5})()
    for i, offset, error in zip(range(3), (0.5, -0.4, 0.1), (0.9, 0.6, 0.2), strict=True):
        nodes[i] = replace(nodes[i], clock_offset=offset, clock_uncertainty=error)
    coarse = consistency.clocks(nodes, config)
    assert coarse.status is Status.PASS, coarse.message
    assert coarse.message.startswith("no two clocks known to differ by more than 0.5 s: within 0.900 s")
    nodes[2] = replace(nodes[2], clock_offset=3.0)
    late = consistency.clocks(nodes, config)
    assert late.status is Status.FAIL and "n2 is +2.500 s" in late.message and "n0" not in late.message


def test_junit_has_a_suite_per_host_and_a_case_per_check():
    results = [
        CheckResult("torch.import", Status.PASS, "n1: ok", host="n1"),
        CheckResult("gpu.ecc", Status.FAIL, "n2: ecc", host="n2", remediation="reset"),
        CheckResult("gpu.count", Status.SKIP, "n2: none", host="n2"),
        CheckResult("consistency.torch", Status.ERROR, "boom"),
    ]
    root = ET.fromstring(report.render(report.Report(results, ["n1", "n2"]), "junit"))
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert list(suites) == ["n1", "n2", "(cluster)"]
    assert suites["n2"].get("failures") == "1" and suites["n2"].get("skipped") == "1"
    failure = suites["n2"].find("testcase[@name='gpu.ecc']/failure").text
    assert failure == "n2: ecc\nfix: reset"  # contract: the junit failure body CI shows, the message then its fix
    assert root.get("tests") == "4" and root.get("errors") == "1"


def test_a_torchvision_built_for_another_torch_fails_torch_import_naming_it():
    raw = json.loads((Path(__file__).parent / "records" / "facts-torchvision-from-pypi.json").read_text())
    facts = collect.build(
        Node(name="n1", address="n1", packages=("numpy",)), raw, python="/opt/venv/bin/python", python_source="x"
    )
    result = by_name(facts)["torch.import"]
    assert result.status is Status.FAIL
    assert result.message.startswith("n1: numpy does not import with /opt/venv/bin/python: not installed")
    assert "torchvision" in result.message and result.data["broken"]["torchvision"].endswith(
        "operator torchvision::nms does not exist"
    )
    assert facts.torch_problem is None  # torch itself imports: the torch jobs still run


def test_torchvision_of_another_cuda_variant_or_torch_release_is_a_mismatch():
    from clustercheck.checks.environment import torchvision_mismatch
    from clustercheck.facts.model import Package

    cu = Package("torchvision", "0.28.0+cu128", None, ("torch (==2.13.0)",))
    assert "cu128 build" in torchvision_mismatch("2.13.0+cpu", cu)
    old = Package("torchvision", "0.27.0", None, ("torch (==2.12.0)",))
    assert "built for torch==2.12.0" in torchvision_mismatch("2.13.0", old)
    assert torchvision_mismatch("2.13.0+cpu", Package("torchvision", "0.28.0+cpu", None, ("torch==2.13.0",))) is None


def recorded_node(name: str, cluster_size: int = 3) -> NodeFacts:
    raw = json.loads((Path(__file__).parent / "records" / name).read_text())
    return collect.build(
        Node(name="node3", address="node3"),
        raw,
        python="/opt/clustercheck/venv/bin/python",
        python_source="/etc/clustercheck/python",
        cluster_size=cluster_size,
    )


def test_a_small_shm_and_a_stopped_chrony_fail_with_their_causes():
    """Recorded on a test node with /dev/shm remounted at 64 MiB, a 32 MiB tmpfs on /tmp and chrony stopped. The
    small /tmp is fs.space's, from the first command's file system reading (test_filesystems.py), which this record
    predates: disk.free judges the root file system alone, which has room."""
    results = by_name(recorded_node("facts-node3-shm-tmp-chrony.json"))
    shm = results["shm.size"]
    assert shm.status is Status.FAIL and shm.message.startswith("node3: /dev/shm is 64 MiB, less than 256 MiB")
    disk = results["disk.free"]
    assert disk.status is Status.PASS and "/tmp" not in disk.message, disk.message
    clock = results["time.sync"]
    assert clock.status is Status.FAIL and "chronyd does not answer (506 Cannot talk to daemon)" in clock.message
    assert "systemctl enable --now chrony" in clock.remediation
    # On one node a stopped chrony is a warning, as an unsynchronized clock is.
    alone = by_name(recorded_node("facts-node3-shm-tmp-chrony.json", cluster_size=1))["time.sync"]
    assert alone.status is Status.WARN


def test_shm_between_the_failure_and_the_recommended_size_warns():
    facts = recorded_node("facts-node3-shm-tmp-chrony.json")
    half = 512 << 20
    facts = replace(facts, shm=type(facts.shm)("/dev/shm", half, half))
    result = by_name(facts)["shm.size"]
    assert result.status is Status.WARN and "0.50 GiB, less than 1 GiB" in result.message


def test_the_kernels_neighbour_table_overflow_lines_of_both_eras_are_found():
    data = Path(__file__).parent / "data"
    old = parse.neighbour_overflows((data / "kernel-log-neighbour-overflow-lkml-2001.txt").read_text())
    assert old == [  # verbatim: the recorded kernel lines, as found
        "Jul 28 19:47:44 sunburn kernel: Neighbour table overflow.",
        "Jul 28 19:47:49 sunburn kernel: Neighbour table overflow.",
    ]
    new = parse.neighbour_overflows((data / "kernel-log-neighbour-overflow-netdev-2019.txt").read_text())
    assert new == ["neighbour: arp_cache: neighbor table overflow!"]  # verbatim: the recorded kernel line
    assert parse.neighbour_overflows("NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.") == []


def test_overflow_lines_inside_a_long_kernel_log_are_found_whole_and_alone():
    """The log is searched as one text: each finding is its own full line, not its neighbours', wherever it sits
    (first, among 2,000 lines of this machine's recorded dmesg, last without a newline)."""
    data = Path(__file__).parent / "data"
    lines = (data / "kernel-log-neighbour-overflow-lkml-2001.txt").read_text().splitlines()
    found = [line for line in lines if "table overflow" in line]
    recorded = json.loads((Path(__file__).parents[2] / "benchmarks/data/scale-core-localhost.json").read_text())
    dmesg = json.loads(recorded["answers"]["facts"]["stdout"])["commands"]["dmesg"]["out"]
    assert dmesg.count("\n") > 1000 and parse.neighbour_overflows(dmesg) == []
    middle = dmesg.index("\n", len(dmesg) // 2) + 1
    log = found[0] + "\n" + dmesg[:middle] + found[1] + "\n" + dmesg[middle:] + found[0]
    assert parse.neighbour_overflows(log) == [found[0], found[1], found[0]]


def copies(facts: NodeFacts, count: int) -> list[NodeFacts]:
    return [
        replace(facts, node=Node(name=f"node{i}", address=f"10.0.{i // 250}.{i % 250 + 1}"))
        for i in range(1, count + 1)
    ]


def test_the_neighbour_table_is_judged_against_the_number_of_nodes():
    """The development machine's kernel defaults (gc_thresh2 512, gc_thresh3 1024) hold three nodes, not 600."""
    localhost = recorded_node("facts-debian12-localhost.json")
    assert localhost.neigh == NeighThresholds(512, 1024)
    small = system.neighbour_table(copies(localhost, 3), None)
    assert small.status is Status.PASS and "room for 3 nodes" in small.message
    big = system.neighbour_table(copies(localhost, 600), None)
    assert big.status is Status.WARN
    assert "too small for 600 nodes on node1 (gc_thresh2 512, gc_thresh3 1024)" in big.message
    assert "net.ipv4.neigh.default.gc_thresh3 = 32768" in big.fix  # the base role's values hold 600 nodes
    huge = system.neighbour_table(copies(localhost, 5000), None)
    assert "net.ipv4.neigh.default.gc_thresh1 = 16384" in huge.fix and "gc_thresh3 = 65536" in huge.fix


def test_a_node_whose_kernel_log_says_the_table_overflowed_fails_by_name():
    """The overflow line is read where the log is collected and kept as a fact of its own; the whole log is not
    kept past the node's own checks (stages/core.settled), and the cluster check still finds the line."""
    localhost = recorded_node("facts-debian12-localhost.json")
    nodes = copies(localhost, 3)
    raw = json.loads((Path(__file__).parent / "records" / "facts-debian12-localhost.json").read_text())
    log = (Path(__file__).parent / "data" / "kernel-log-neighbour-overflow-netdev-2019.txt").read_text()
    raw["commands"]["kernel_log"] = {"rc": 0, "out": log, "err": ""}
    overflowed = collect.build(nodes[2].node, raw, python="python3", python_source="PATH", cluster_size=3)
    nodes[2] = settled(overflowed)
    assert nodes[2].kernel_log is None and "commands" not in nodes[2].raw  # nothing of the whole log is left
    result = system.neighbour_table(nodes, None)
    assert result.status is Status.FAIL
    assert "node3: once, last: neighbour: arp_cache: neighbor table overflow!" in result.message
    assert "node1" not in result.message
    assert setup_roles.fix_command(registry.get("neighbour.table").result(None, result), "hosts.ini") == (
        "ansible-playbook site.yml -i hosts.ini --limit node3 --tags base"  # contract: the command a user runs
    )


def test_containers_that_do_not_show_the_table_skip_it():
    """Recorded in a test node: a container's own network namespace has no neigh/default (the host's table)."""
    container = recorded_node("facts-node3-shm-tmp-chrony.json")
    assert container.neigh == NeighThresholds(None, None)
    result = system.neighbour_table(copies(container, 3), None)
    assert result.status is Status.SKIP and "containers share their host's table" in result.message
    mixed = system.neighbour_table(
        [
            *copies(container, 2),
            replace(recorded_node("facts-debian12-localhost.json"), node=Node(name="node9", address="node9")),
        ],
        None,
    )
    assert mixed.status is Status.PASS and "not shown on node1, node2" in mixed.message


def test_the_neighbour_fix_names_the_thresholds_the_base_role_writes():
    import yaml

    defaults = yaml.safe_load((Path(__file__).parents[2] / "roles" / "base" / "defaults" / "main.yml").read_text())
    written = {k: v for k, v in defaults["base_sysctl"].items() if k.startswith("net.ipv4.neigh.")}
    assert written == system.NEIGH_BASE


def test_limits_read_on_no_node_are_never_called_room():
    """A container's namespace on one node and a probe error on the other: no limits were read, so no PASS."""
    container = recorded_node("facts-node3-shm-tmp-chrony.json")
    (one, two) = copies(container, 2)
    result = system.neighbour_table([one, replace(two, neigh=None)], None)
    assert result.status is Status.WARN and "could not collect on node2" in result.message


A100_470 = (Path(__file__).parent / "data" / "nvidia-smi-q-a100-sxm4-80gb-cudalibrarysamples-104.txt").read_text()


def cuda_torch(cuda: str, available: bool) -> dict:
    return {
        "version": f"2.13.0+cu{cuda.replace('.', '')}",
        "cuda": cuda,
        "cuda_available": available,
        "device_count": 1 if available else 0,
        "nccl": "2.27.3" if available else None,
        "nccl_backend": True,
        "gloo": True,
    }


def test_torch_cuda_build_against_the_recorded_drivers():
    # H800: driver 525.105.17, CUDA 12.0; A100: driver 470.103.01, CUDA 11.4 (tests/unit/data/README.md)
    older = by_name(node_facts(gpus_expected=1, smi=H800, torch=cuda_torch("11.8", True)))["torch.driver"]
    assert older.status is Status.PASS and "driver 525.105.17 supports CUDA 12.0" in older.message
    minor = by_name(node_facts(gpus_expected=1, smi=H800, torch=cuda_torch("12.8", True)))["torch.driver"]
    assert minor.status is Status.WARN and "minor-version compatibility (driver >= 525.60.13)" in minor.message
    also_minor = by_name(node_facts(gpus_expected=1, smi=A100_470, torch=cuda_torch("11.8", True)))["torch.driver"]
    assert also_minor.status is Status.WARN and ">= 450.80.02" in also_minor.message
    results = by_name(node_facts(gpus_expected=1, smi=A100_470, torch=cuda_torch("12.8", False)))
    assert results["torch.driver"].status is Status.FAIL
    assert "CUDA 12.x needs driver >= 525.60.13" in results["torch.driver"].message
    assert "driver 470.103.01 supports CUDA 11.4" in results["torch.driver"].message
    # torch.cuda's FAIL names that cause instead of only "built for CUDA 12.8"
    assert results["torch.cuda"].status is Status.FAIL and ">= 525.60.13" in results["torch.cuda"].message
    # CUDA working all the same on that driver: NVIDIA's forward-compatibility package is what makes it work
    forward = by_name(node_facts(gpus_expected=1, smi=A100_470, torch=cuda_torch("12.8", True)))["torch.driver"]
    assert forward.status is Status.PASS and "forward compatibility is in use" in forward.message


def test_torch_driver_skips_a_cpu_build_and_a_node_without_gpus():
    assert by_name(node_facts(gpus_expected=1, smi=H800))["torch.driver"].status is Status.SKIP
    assert by_name(node_facts(torch=cuda_torch("12.8", False)))["torch.driver"].status is Status.SKIP
