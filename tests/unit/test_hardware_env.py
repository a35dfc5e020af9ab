"""The checks of issue 11 sections 1-3 judged on recorded outputs: NCCL INFO logs from public issue threads,
ibstatus (the sysfs files of /sys/class/infiniband) and nvidia-smi -q of real machines (tests/unit/data/README.md)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from test_checks import H800, by_name, node_facts
from wording import says

from clustercheck.checks import consistency, nccl_net, registry
from clustercheck.facts import parse
from clustercheck.model import Status

DATA = Path(__file__).parent / "data"
NCCL = DATA / "nccl"


def ibstatus_to_sysfs(text: str) -> dict:
    """ibstatus prints /sys/class/infiniband/<dev>/ports/<port>/{state,phys_state,rate,link_layer} as they are:
    the collector's `infiniband` value from it."""
    ports: dict = {}
    for block in text.strip().split("\n\n"):
        head = re.match(r"Infiniband device '(\S+)' port (\d+) status:", block)
        fields = dict(line.strip().split(":", 1) for line in block.splitlines()[1:])
        values = {k: v.strip() for k, v in fields.items()}
        ports.setdefault(head[1], {})[head[2]] = {
            "state": values["state"],
            "phys_state": values["phys state"],
            "rate": values["rate"],
            "link_layer": values["link_layer"],
        }
    return ports


ROCE = ibstatus_to_sysfs((DATA / "ibstatus-roce-nccl-1866.txt").read_text())
NETDEVS = {
    "lo": {"type": "772", "bridge": False, "virtual": True, "operstate": "unknown"},
    "eth0": {"type": "1", "bridge": False, "virtual": False, "operstate": "up"},
    "docker0": {"type": "1", "bridge": True, "virtual": True, "operstate": "down"},
}
IP_ADDR = "2: eth0    inet 10.0.0.5/24 brd 10.0.0.255 scope global eth0\\       valid_lft forever preferred_lft forever"


def facts(name="node1", **raw):
    raw.setdefault("netdevs", NETDEVS)
    raw.setdefault("launch_files", {"/etc/environment": 'PATH="/usr/bin"\n'})
    raw.setdefault("infiniband", {})
    raw.setdefault("modules", ["nvidia", "ib_core"])
    raw.setdefault("cmdline", "BOOT_IMAGE=/vmlinuz ro quiet")
    route = "1.1.1.1 via 10.0.0.1 dev eth0 src 10.0.0.5 uid 0"
    raw.setdefault("commands", {"ip_addr": {"rc": 0, "out": IP_ADDR}, "ip_route": {"rc": 0, "out": route}})
    return node_facts(name, **raw)


# ----------------------------------------------------------------------------- NCCL's INFO log


@pytest.mark.parametrize(
    "log, network, gdr, intra",
    [
        ("ib-gdr-aks-rdma-infiniband-pr36.log", "ib", True, {}),
        ("ib-p2p-nccl-1412.log", "ib", False, {"P2P/direct": 4}),
        ("ib-nv_peer_memory-56.log", "ib", None, {}),  # NCCL 2.5: no "Using network" line yet
        ("roce-nccl-1537.log", "roce", False, {}),
        ("roce-nccl-tests-185.log", "roce", None, {}),
        ("socket-nccl-1232.log", "socket", False, {"SHM": 2}),
        ("socket-nccl-226.log", "socket", None, {}),
        ("socket-p2p-ipc-nccl-952.log", "socket", False, {"P2P/IPC": 3}),
        ("socket-lo-h200-vm.log", "socket", None, {}),
    ],
)
def test_the_network_gdr_and_intra_node_paths_are_read_from_real_nccl_logs(log, network, gdr, intra):
    found = nccl_net.parse_nccl_log((NCCL / log).read_text())
    assert found.network == network
    assert found.gdr is gdr
    assert dict(found.intra) == intra


def test_hcas_interfaces_and_disabled_gdr_are_named():
    roce = nccl_net.parse_nccl_log((NCCL / "roce-nccl-1537.log").read_text())
    assert roce.hcas == {"mlx5_0:1": "RoCE", "mlx5_1:1": "RoCE"}
    assert roce.gdr_disabled == ["mlx5_0", "mlx5_1"]
    assert roce.oob == "primaryip"
    assert nccl_net.parse_nccl_log((NCCL / "socket-nccl-226.log").read_text()).socket_ifaces == ["ens3"]
    assert nccl_net.parse_nccl_log((NCCL / "ib-nv_peer_memory-56.log").read_text()).ib_disabled is False
    assert nccl_net.parse_nccl_log((NCCL / "socket-p2p-ipc-nccl-952.log").read_text()).channel_nets == {"Socket": 2}
    h200 = nccl_net.parse_nccl_log((NCCL / "socket-lo-h200-vm.log").read_text())  # NCCL 2.28.9, one rank
    assert h200.no_ib_device and h200.socket_ifaces == ["lo"] and h200.oob == "lo"


def test_nccl_on_sockets_beside_an_active_rdma_port_is_a_warning_with_the_cause():
    log = nccl_net.parse_nccl_log((NCCL / "socket-nccl-1232.log").read_text())
    node = facts(infiniband=ROCE)
    found = nccl_net.judge_nccl(log, node, None)
    assert found.status is Status.WARN
    assert "NCCL over sockets" in found.message and "active roce port(s) (mlx5_0:1, mlx5_1:1)" in found.message
    with_disable = facts(infiniband=ROCE, launch_files={"/etc/environment": "NCCL_IB_DISABLE=1\n"})
    assert "NCCL_IB_DISABLE=1 is set" in nccl_net.judge_nccl(log, with_disable, None).message
    assert nccl_net.judge_nccl(log, facts(), None).status is Status.PASS  # no RDMA hardware: sockets expected


def test_the_expected_transport_is_enforced():
    ib = nccl_net.parse_nccl_log((NCCL / "ib-gdr-aks-rdma-infiniband-pr36.log").read_text())
    assert nccl_net.judge_nccl(ib, facts(), "ib").status is Status.PASS
    wrong = nccl_net.judge_nccl(ib, facts(), "roce")
    assert wrong.status is Status.FAIL and "roce was expected" in wrong.message
    sockets = nccl_net.parse_nccl_log((NCCL / "socket-p2p-ipc-nccl-952.log").read_text())
    assert nccl_net.judge_nccl(sockets, facts(), "ib").status is Status.FAIL
    assert nccl_net.judge_nccl(nccl_net.parse_nccl_log(""), facts(), "ib").status is Status.SKIP


def test_ib_without_gpudirect_on_a_gpu_node_names_missing_peermem():
    log = nccl_net.parse_nccl_log((NCCL / "ib-p2p-nccl-1412.log").read_text())
    found = nccl_net.judge_nccl(log, facts(smi=H800), None)
    assert found.status is Status.WARN and "nvidia-peermem is not loaded" in found.message


def test_gloo_reports_the_interface_its_connections_bound_to():
    node = facts()
    records = [
        {
            "endpoints": [
                {
                    "local": "10.0.0.5",
                    "local_port": 40000,
                    "remote": "10.0.0.6",
                    "remote_port": 41000,
                    "state": "established",
                },
                {
                    "local": "10.0.0.5",
                    "local_port": 40001,
                    "remote": "10.0.0.7",
                    "remote_port": 29500,
                    "state": "established",
                },
            ]
        }
    ]
    found = nccl_net.judge_gloo(records, node, "eth0", 29500, None)
    assert found.status is Status.PASS and says(found.message, "gloo", "eth0 (10.0.0.5)")
    loop = [
        {
            "endpoints": [
                {"local": "127.0.0.1", "local_port": 1, "remote": "127.0.0.1", "remote_port": 2, "state": "established"}
            ]
        }
    ]
    wrong = nccl_net.judge_gloo(loop, node, "eth0", 29500, None)
    assert wrong.status is Status.FAIL and "bound to lo" in wrong.message


# ----------------------------------------------------------------------------- hardware


def test_rdma_ports_from_sysfs_are_judged_and_a_slow_port_is_named():
    node = facts(infiniband=ROCE)
    assert [p.rate_gbps for p in node.rdma_ports] == [100.0, 100.0]
    result = by_name(node)["fabric.ports"]
    assert result.status is Status.PASS and "mlx5_0:1 RoCE 100 Gb/sec (4X EDR)" in result.message
    # Derived: mlx5_1's port as a cable pulled out shows it (state 1: DOWN, phys state 3: Disabled).
    down = {**ROCE, "mlx5_1": {"1": {**ROCE["mlx5_1"]["1"], "state": "1: DOWN", "phys_state": "3: Disabled"}}}
    result = by_name(facts(infiniband=down))["fabric.ports"]
    assert result.status is Status.WARN and "1 of 2 RDMA port(s) not active: mlx5_1:1 DOWN/Disabled" in result.message
    all_down = {
        name: {"1": {**ports["1"], "state": "1: DOWN", "phys_state": "3: Disabled"}} for name, ports in ROCE.items()
    }
    assert by_name(facts(infiniband=all_down))["fabric.ports"].status is Status.FAIL
    assert by_name(facts())["fabric.ports"].status is Status.SKIP
    # Derived: node2's mlx5_1 trained at half rate.
    half = {**ROCE, "mlx5_1": {"1": {**ROCE["mlx5_1"]["1"], "rate": "50 Gb/sec (2X EDR)"}}}
    nodes = [facts("node1", infiniband=ROCE), facts("node2", infiniband=half), facts("node3", infiniband=ROCE)]
    rate = registry.get("consistency.fabric_rate").function(nodes, None)
    assert rate.status is Status.FAIL
    assert "node2 mlx5_1:1 at 50 Gb/s where the other nodes' mlx5_1:1 run at 100" in rate.message


def test_peermem_is_needed_where_gpus_and_rdma_ports_share_a_node():
    missing = by_name(facts(smi=H800, infiniband=ROCE))["fabric.peermem"]
    assert missing.status is Status.WARN and "nvidia-peermem is not loaded" in missing.message
    loaded = by_name(facts(smi=H800, infiniband=ROCE, modules=["nvidia", "nvidia_peermem"]))["fabric.peermem"]
    assert loaded.status is Status.PASS
    assert by_name(facts(smi=H800))["fabric.peermem"].status is Status.SKIP


def test_h800_pcie_remapped_rows_power_and_identity():
    results = by_name(facts(smi=H800))
    assert results["pcie.link"].status is Status.PASS and "x16" in results["pcie.link"].message
    assert results["gpu.remapped_rows"].status is Status.PASS
    assert results["gpu.power_clocks"].message.endswith(
        "power cap 700 W, at the board default; application clocks at their defaults"
    )
    identity = results["gpu.identity"]
    assert identity.data["gpus"]["00000000:18:00.0"] == {
        "uuid": "GPU-34bf77d1-c686-6821-79a8-32d326c5039c",
        "serial": "1651323018291",
        "vbios": "96.00.51.00.0E",
        "name": "NVIDIA H800",
    }


def _edit(old: str, new: str) -> str:
    assert H800.count(old) == 1
    return H800.replace(old, new)


def test_degraded_h800_fields_are_named():
    # Derived from the H800 recording by editing single lines, as each fault shows in nvidia-smi -q.
    narrow = _edit("                Current                   : 16x", "                Current                   : 8x")
    assert "00000000:18:00.0: x8 of x16" in by_name(facts(smi=narrow))["pcie.link"].message
    idle = _edit("                Current                   : 5\n", "                Current                   : 1\n")
    assert by_name(facts(smi=idle))["pcie.link"].status is Status.PASS  # GPUs lower the generation when idle
    pending = _edit("        Pending                           : No", "        Pending                           : Yes")
    assert "a GPU reset applies it" in by_name(facts(smi=pending))["gpu.remapped_rows"].message
    failed = _edit("Remapping Failure Occurred        : No", "Remapping Failure Occurred        : Yes")
    assert by_name(facts(smi=failed))["gpu.remapped_rows"].status is Status.FAIL
    capped = _edit("Enforced Power Limit              : 700.00 W", "Enforced Power Limit              : 500.00 W")
    assert "power cap 500 W, default 700 W" in by_name(facts(smi=capped))["gpu.power_clocks"].message


def test_iommu_mode_from_the_kernel_command_line():
    assert parse.iommu_mode("ro intel_iommu=on iommu=pt") == "passthrough"
    assert parse.iommu_mode("ro amd_iommu=on") == "translated"
    assert parse.iommu_mode("ro quiet") == "default"
    assert by_name(facts(smi=H800, cmdline="ro intel_iommu=on"))["pcie.iommu"].status is Status.WARN
    assert by_name(facts(smi=H800))["pcie.iommu"].status is Status.PASS


def test_vbios_consistency():
    other = H800.replace("96.00.51.00.0E", "96.00.30.00.01")
    nodes = [facts("node1", smi=H800), facts("node2", smi=other), facts("node3", smi=H800)]
    result = registry.get("consistency.vbios").function(nodes, None)
    assert result.status is Status.FAIL and "node2 has 96.00.30.00.01" in result.message


# ----------------------------------------------------------------------------- environment


def test_package_drift_names_the_package_nodes_and_versions():
    pip = {"torch": "2.13.0", "numpy": "1.26.4", "filelock": "3.13.1"}
    nodes = [
        facts("node1", packages={"pip": pip}),
        facts("node2", packages={"pip": {**pip, "numpy": "2.0.0"}}),
        facts("node3", packages={"pip": {k: v for k, v in pip.items() if k != "filelock"}}),
    ]
    result = consistency.packages(nodes, None)
    assert result.status is Status.FAIL  # numpy runs other code on node2's ranks
    assert result.message.startswith("2 package(s) differ between nodes: numpy: node2 has 2.0.0, the others 1.26.4")
    assert "filelock: node3 has none, the others 3.13.1" in result.message
    # A package only some nodes have (an extra tool, or one missing that fails loudly on import) is a warning.
    lacking = consistency.packages(nodes[:1] + nodes[2:] + [facts("node4", packages={"pip": pip})], None)
    assert lacking.status is Status.WARN and "filelock: node3 has none, the others 3.13.1" in lacking.message
    same = [facts(n, packages={"pip": pip, "conda": {"python": "3.11.9=h955ad1f_0"}}) for n in ("a", "b")]
    assert consistency.packages(same, None).status is Status.PASS


@pytest.mark.parametrize(
    "text, status, words",
    [
        ("GLOO_SOCKET_IFNAME=eth9\n", Status.FAIL, "/etc/environment sets GLOO_SOCKET_IFNAME=eth9: no interface eth9"),
        ('export NCCL_SOCKET_IFNAME="lo"\n', Status.FAIL, "lo is loopback"),
        ("NCCL_SOCKET_IFNAME=docker\n", Status.FAIL, "docker0 is a container bridge"),
        ("NCCL_SOCKET_IFNAME=^docker0,lo\n", Status.PASS, "every interface named exists"),
        ("NCCL_SOCKET_IFNAME=^eth\n", Status.FAIL, "it excludes eth0, the cluster interface"),
        (
            "NCCL_SOCKET_IFNAME=eth\nGLOO_SOCKET_IFNAME=eth0\n",
            Status.PASS,
            "NCCL_SOCKET_IFNAME=eth, GLOO_SOCKET_IFNAME=eth0",
        ),
        ("# NCCL_SOCKET_IFNAME=eth9\n", Status.PASS, "no NCCL_* or GLOO_* variable"),
        ("NCCL_IB_HCA=mlx5_7\n", Status.FAIL, "no RDMA device mlx5_7"),
    ],
)
def test_the_launch_environment_is_checked_against_the_node(text, status, words):
    result = by_name(facts(launch_files={"/etc/environment": text}, infiniband=ROCE))["env.launch"]
    assert result.status is status, result.message
    assert words in result.message


def test_ib_disabled_in_profile_d_beside_active_ports_is_a_warning():
    files = {"/etc/environment": "", "/etc/profile.d/nccl.sh": "export NCCL_IB_DISABLE=1\n"}
    result = by_name(facts(launch_files=files, infiniband=ROCE))["env.launch"]
    assert result.status is Status.WARN
    assert "/etc/profile.d/nccl.sh sets NCCL_IB_DISABLE=1" in result.message


def test_facts_not_collected_give_the_reason():
    node = facts(launch_files={"error": "PermissionError: denied"}, netdevs={"error": "OSError: x"})
    result = by_name(node)["env.launch"]
    assert result.status is Status.WARN and "PermissionError: denied" in result.message


# ----------------------------------------------------------------------------- NVLink, ACS, DCGM


def test_inactive_nvlinks_are_named():
    v100 = (DATA / "nvlink-s-v100-azhpc-diagnostics-73.txt").read_text()
    result = by_name(facts(smi=H800, commands=_with(nvlink={"rc": 0, "out": v100})))["gpu.nvlink"]
    assert result.status is Status.WARN
    assert says(result.message, "node1: ", "GPU 3 (Tesla V100-SXM2-32GB)", "link(s) 3, 5 inactive")
    gb200 = (DATA / "nvlink-s-gb200-k8s-test-infra-371.txt").read_text()
    result = by_name(facts(smi=H800, commands=_with(nvlink={"rc": 0, "out": gb200})))["gpu.nvlink"]
    assert result.status is Status.PASS and "20 NVLink(s) active on 2 GPU(s) (53.125 GB/s)" in result.message
    pcie_only = by_name(facts(smi=H800, commands=_with(nvlink={"rc": 0, "out": ""})))["gpu.nvlink"]
    assert pcie_only.status is Status.SKIP


def test_nvlink_error_counters_are_read_and_a_link_that_counted_errors_is_named():
    """Both recordings count no error (PASS, the elided links passed over); a link with errors is derived from the
    H100 recording by editing two of its counter lines."""
    h100 = (DATA / "nvlink-e-h100-ml-engineering.txt").read_text()
    gb300 = (DATA / "nvlink-e-gb300-srt-slurm-307.txt").read_text()
    result = by_name(facts(smi=H800, commands=_with(nvlink_errors={"rc": 0, "out": h100})))["gpu.nvlink_errors"]
    assert result.status is Status.PASS
    assert says(result.message, "node1: ", "no error", "3 NVLink(s) of 1 GPU(s)")
    result = by_name(facts(smi=H800, commands=_with(nvlink_errors={"rc": 0, "out": gb300})))["gpu.nvlink_errors"]
    assert result.status is Status.PASS and "1 NVLink(s) of 1 GPU(s)" in result.message
    failing = h100.replace("Link 1: Replay Errors: 0", "Link 1: Replay Errors: 42").replace(
        "Link 1: Recovery Errors: 0", "Link 1: Recovery Errors: 3"
    )
    result = by_name(facts(smi=H800, commands=_with(nvlink_errors={"rc": 0, "out": failing})))["gpu.nvlink_errors"]
    assert result.status is Status.WARN
    assert says(result.message, "node1: ", "GPU 0 (NVIDIA H100 80GB HBM3)", "link 1", "42 replay", "3 recovery")
    assert result.data["errors"] == {"0": {"1": {"Replay Errors": 42, "Recovery Errors": 3, "CRC Errors": 0}}}
    no_nvlink = by_name(facts(smi=H800, commands=_with(nvlink_errors={"rc": 0, "out": ""})))["gpu.nvlink_errors"]
    assert no_nvlink.status is Status.SKIP


def _with(**commands):
    route = "1.1.1.1 via 10.0.0.1 dev eth0 src 10.0.0.5 uid 0"
    return {"ip_addr": {"rc": 0, "out": IP_ADDR}, "ip_route": {"rc": 0, "out": route}, **commands}


ACSCTL = (DATA / "lspci-acsctl-nccl-523.txt").read_text().splitlines()
BRIDGE_OFF = (DATA / "lspci-vv-bridge-openvmm-3461.txt").read_text()


def bridges(acs_lines: dict[str, str]) -> dict:
    """Two GPUs below a switch (sysfs chains as the collector records them), each bridge's lspci -vvv output
    being one of the recorded ACSCtl lines or the recorded bridge."""
    return {
        "gpus": {
            "0000:1b:00.0": ["0000:16:01.0", "0000:17:00.0", "0000:18:08.0"],
            "0000:1c:00.0": ["0000:16:01.0", "0000:17:00.0", "0000:18:10.0"],
        },
        "lspci": {bdf: {"rc": 0, "out": text} for bdf, text in acs_lines.items()},
    }


def test_acs_redirection_above_the_gpus_is_named():
    on = bridges(
        {"0000:16:01.0": BRIDGE_OFF, "0000:17:00.0": ACSCTL[1], "0000:18:08.0": ACSCTL[0], "0000:18:10.0": ACSCTL[3]}
    )
    result = by_name(facts(smi=H800, gpu_bridges=on))["pcie.acs"]
    assert result.status is Status.WARN
    assert (
        "1 bridge(s): 0000:18:08.0 (CmpltRedir+, ReqRedir+, SrcValid+, UpstreamFwd+) above 0000:1b:00.0"
        in result.message
    )
    off = bridges(
        {"0000:16:01.0": BRIDGE_OFF, "0000:17:00.0": ACSCTL[3], "0000:18:08.0": ACSCTL[2], "0000:18:10.0": ACSCTL[3]}
    )
    assert by_name(facts(smi=H800, gpu_bridges=off))["pcie.acs"].status is Status.PASS
    vm = by_name(facts(smi=H800, gpu_bridges=on, commands=_with(virt={"rc": 0, "out": "kvm\n"})))["pcie.acs"]
    assert vm.status is Status.SKIP and "kvm" in vm.message
    one = {"gpus": {"0000:1b:00.0": ["0000:16:01.0"]}, "lspci": {}}
    assert by_name(facts(smi=H800, gpu_bridges=one))["pcie.acs"].status is Status.SKIP
    # lspci without root prints "Capabilities: [100 v1] <access denied>" for the extended capabilities.
    denied = bridges({b: "\tCapabilities: [100 v1] <access denied>\n" for b in ("0000:16:01.0", "0000:17:00.0")})
    assert "run clustercheck as root" in by_name(facts(smi=H800, gpu_bridges=denied))["pcie.acs"].message


def test_dcgm_verdicts_from_recorded_runs(tmp_path):
    from fakes import FakeNode

    from clustercheck.stages import gpuwork
    from clustercheck.transport import CommandResult

    def dcgmi(out: str, status: int | None = 0, timed_out: bool = False) -> FakeNode:
        return FakeNode("node1", CommandResult(status, out, "", timed_out=timed_out))

    passing = (DATA / "dcgm" / "diag-r3-dcgm-55.txt").read_text()
    fake = dcgmi(passing)
    node = facts(smi=H800, dcgmi="/usr/bin/dcgmi")
    assert by_name(node)["gpu.dcgm"].status is Status.SKIP  # off unless asked for
    node = replace(node, dcgm=gpuwork.dcgm_diag("/usr/bin/dcgmi", 3, fake, tmp_path))
    assert [c[:2] for c in fake.calls] == [(["/usr/bin/dcgmi", "diag", "-r", "3"], 3600.0)]
    assert (tmp_path / "dcgm-diag.txt").read_text() == passing
    assert says(by_name(node)["gpu.dcgm"].message, "node1: ", "DCGM level 3", "9 test(s) pass", "0 skipped")
    # Derived from go-dcgm issue 52's run by editing one row, as a failing test shows there.
    failing = (
        (DATA / "dcgm" / "diag-r2-go-dcgm-52.txt")
        .read_text()
        .replace("| Environment Variables     | Pass       ", "| Environment Variables     | Fail       ")
    )
    node = replace(node, dcgm=gpuwork.dcgm_diag("/usr/bin/dcgmi", 2, dcgmi(failing), tmp_path))
    result = by_name(node)["gpu.dcgm"]
    assert result.status is Status.FAIL and "Environment Variables: Fail" in result.message
    assert result.data["metadata"]["DCGM Version"] == "3.3.1"
    node = replace(node, dcgm=gpuwork.dcgm_diag("/usr/bin/dcgmi", 1, dcgmi("", None, timed_out=True), tmp_path))
    assert "no verdict within 120 s" in by_name(node)["gpu.dcgm"].message
    info = parse.parse_dcgmi_diag((DATA / "dcgm" / "diag-r3-nccl-tests-264.txt").read_text())
    assert info["tests"][4] == {
        "section": "Deployment",
        "test": "Persistence Mode",
        "result": "Pass",
        "info": "Persistence mode for GPU 0 is disabled. Enabl",
    }


def test_the_collectives_stage_reads_only_this_jobs_nccl_logs(tmp_path):
    import os
    import time

    from clustercheck.config import RunConfig
    from clustercheck.reach import Fanout
    from clustercheck.stages import Context, Member, collectives, torchjob
    from clustercheck.transport import factory

    config = RunConfig(run_dir=tmp_path, expect_transport="ib")
    node = facts("node1")
    member = Member(node.node, None, node, "10.0.0.5", "eth0", "node1", 8)
    host = config.host_dir("node1")
    started = time.time()
    old = host / "nccl-node1-100.log"  # the node-local job's log, from before the stage started
    old.write_text((NCCL / "socket-nccl-1232.log").read_text())
    os.utime(old, (started - 60, started - 60))
    (host / "nccl-node1-200.log").write_text((NCCL / "ib-gdr-aks-rdma-infiniband-pr36.log").read_text())
    outcome = torchjob.JobOutcome([], 16, "nccl")
    [result] = collectives.transport_results(
        [member], outcome, Context(config, lambda h, s: None, ("node1",), Fanout(factory.default(config.ssh))), started
    )
    assert result.name == "transport.network" and result.status is Status.PASS
    assert says(result.message, "node1: ", "NCCL over IB", "HCAs not named", "GPUDirect RDMA used")
    assert result.data["expected"] == "ib" and result.data["network"] == "ib"


def test_the_worker_records_its_own_tcp_endpoints():
    import socket

    from clustercheck.remote.endpoints import tcp_endpoints

    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    try:
        mine = [e for e in tcp_endpoints() if e["state"] == "established"]
        port = server.getsockname()[1]
        assert {
            "local": "127.0.0.1",
            "local_port": port,
            "remote": "127.0.0.1",
            "remote_port": client.getsockname()[1],
            "state": "established",
        } in mine
    finally:
        for s in (client, accepted, server):
            s.close()


def test_the_gpus_iommu_domain_decides_over_the_command_line():
    # The domain types are those the kernel documents for /sys/kernel/iommu_groups/<group>/type.
    two = {"0000:1b:00.0": [], "0000:1c:00.0": []}
    dma = {"gpus": two, "lspci": {}, "iommu": {"0000:1b:00.0": "DMA-FQ", "0000:1c:00.0": "DMA-FQ"}}
    result = by_name(facts(smi=H800, gpu_bridges=dma))["pcie.iommu"]
    assert result.status is Status.WARN and "translates the DMA of 2 GPU(s)" in result.message
    identity = {"gpus": two, "lspci": {}, "iommu": {"0000:1b:00.0": "identity", "0000:1c:00.0": "identity"}}
    passthrough = by_name(facts(smi=H800, gpu_bridges=identity, cmdline="ro intel_iommu=on iommu=pt"))["pcie.iommu"]
    assert passthrough.status is Status.PASS and "identity" in passthrough.message


def test_a_locked_memory_limit_warns_only_where_an_rdma_device_needs_it():
    """ulimit -l of 8 MiB (the development machine's, facts-debian12-localhost.json) on a node without
    /sys/class/infiniband passes saying why; on the recorded RoCE node it warns naming the devices."""
    limited = {"soft": 8388608, "hard": 8388608}
    plain = by_name(facts(memlock=limited))["ulimit.memlock"]
    assert plain.status is Status.PASS
    assert says(plain.message, "node1: ", "ulimit -l", "8192 KiB", "no RDMA device", "/sys/class/infiniband")
    roce = by_name(facts(memlock=limited, infiniband=ROCE))["ulimit.memlock"]
    assert roce.status is Status.WARN and "on a node with RDMA device(s) mlx5_0, mlx5_1" in roce.message
    assert "memlock unlimited" in roce.remediation
    unknown = by_name(facts(memlock=limited, infiniband={"error": "PermissionError: [Errno 13]"}))["ulimit.memlock"]
    assert unknown.status is Status.WARN and "could not collect (PermissionError: [Errno 13])" in unknown.message
    unlimited = by_name(facts(memlock={"soft": None, "hard": None}, infiniband=ROCE))["ulimit.memlock"]
    assert unlimited.status is Status.PASS
