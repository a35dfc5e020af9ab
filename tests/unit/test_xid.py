"""gpu.xid by NVIDIA's rules, on recorded kernel logs: the catalog held to NVIDIA's own table, Xid 154 read for the
recovery it names, a site's action per code, and only the Xids the GPU has not left behind judged (a driver loaded
again, or a GPU reset logged, after them)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from clustercheck.checks import registry, xid_catalog
from clustercheck.facts import collect, xidlog
from clustercheck.inventory import InventoryError, Node, node_from_vars
from clustercheck.model import Status
from clustercheck.remote import facts as node
from clustercheck.remote.probing import matching_lines

DATA = Path(__file__).parent / "data"
XID = DATA / "xid"
H200_SMI = json.loads((Path(__file__).parent / "records" / "facts-h200-vm.json").read_text())["commands"][
    "nvidia_smi_q"
]["out"]


def probed(name: str, source: str = "journalctl -k -b") -> dict:
    """The collector's Xid probe (its marks: Xid, driver load, GPU UUID, reset lines) run over a recorded log."""
    return {**matching_lines(["cat", str(XID / name)], node.XID_MARKS), "source": source}


def gpu_xid(xids: dict, xid_actions: dict[int, str] | None = None):
    raw = {"python": {"version": "3.11.2"}, "commands": {"nvidia_smi_q": {"rc": 0, "out": H200_SMI}, "xids": xids}}
    host = Node(name="gpu1", address="gpu1", gpus_expected=1, xid_actions=xid_actions or {})
    facts = collect.build(host, raw, python="/usr/bin/python3", python_source="test")
    return {r.name: r for r in registry.run_node_checks(facts)}["gpu.xid"]


# The catalog as NVIDIA has it


def nvidia_table() -> list[tuple[int, str, str]]:
    """NVIDIA's table as NVSentinel ships it: (code, mnemonic, Resolution Bucket)."""
    with (XID / "nvidia-xid-catalog-nvsentinel.csv").open() as fh:
        return [(int(row[0]), row[1].strip(), row[2].strip()) for row in csv.reader(fh)]


def test_every_code_nvidia_does_not_ignore_is_in_the_catalog_with_nvidias_bucket():
    table = nvidia_table()
    assert len(table) == 162
    for code, mnemonic, bucket in table:
        if bucket == "IGNORE":
            continue
        entry = xid_catalog.lookup(code)
        assert entry is not None, code
        assert (entry.nvidia_action, entry.mnemonic) == (bucket, mnemonic), code


def test_the_codes_nvidia_calls_fatal_with_a_gpu_reset_take_the_gpu_out():
    for code in (46, 62, 109, 110, 136, 143, *range(144, 151), 155, 156, 158):
        entry = xid_catalog.lookup(code)
        assert entry is not None and entry.takes_out and entry.action == xid_catalog.RESET_GPU, code
    assert xid_catalog.lookup(79).action == xid_catalog.REBOOT  # NVIDIA: RESTART_BM


def test_where_the_action_is_not_nvidias_bucket_word_for_word_the_row_says_why():
    same = {"IGNORE": "none", "RESTART_APP": "restart_app", "RESET_GPU": "reset_gpu", "RESTART_BM": "reboot"}
    for entry in xid_catalog.CATALOG.values():
        if same.get(entry.nvidia_action) != entry.action:
            assert entry.note, entry.code
    for code in (63, 92, 94):  # NVIDIA: IGNORE, IGNORE, RESTART_APP; clustercheck no longer takes the GPU out
        assert not xid_catalog.lookup(code).takes_out, code
    assert "gpu.remapped_rows" in xid_catalog.lookup(63).note


def test_a_bad_catalog_row_is_refused_naming_it(tmp_path):
    bad = tmp_path / "catalog.csv"
    bad.write_text("code,mnemonic,nvidia_bucket,action,cause,meaning,note\n48,X,RESET_GPU,drain,hardware,,\n")
    with pytest.raises(ValueError, match="Xid 48"):
        xid_catalog.load(bad)


# Xid 154: the recovery its line names


def test_xid_154_is_judged_by_the_recovery_its_line_names():
    """Talos's kernel log: back-to-back GSP timeouts, then 154 "to 0x1 (GPU Reset Required)"."""
    result = gpu_xid(probed("xid154-open-gpu-kernel-modules-446.log"))
    assert result.status is Status.FAIL
    assert "Xid 154 (GPU recovery action changed, to GPU Reset Required; cause: driver)" in result.message
    assert "at 2026-04-22T21:30:51.870495804Z" in result.message
    assert result.remediation.startswith("Xid 154: drain the node and reset the GPU")
    assert xid_catalog.recovery_action("GPU recovery action changed from 0x1 (x) to 0x0 (None)") == ("none", "None")


# A site's action per code


def test_a_site_action_overrides_the_catalog_and_says_whose_it_is():
    result = gpu_xid(probed("xid154-open-gpu-kernel-modules-446.log"), xid_actions={154: "none"})
    assert result.status is Status.WARN
    assert "the site's action, clustercheck_xid_actions" in result.message
    assert result.data["xids"][154]["site"] is True


def test_the_site_actions_come_from_the_inventory_and_a_bad_one_is_refused_in_one_line():
    assert node_from_vars("n1", {"clustercheck_xid_actions": {"63": "drain_inspect"}}).xid_actions == {
        63: "drain_inspect"
    }
    assert node_from_vars("n1", {"clustercheck_xid_actions": "63:none,94:reset_gpu"}).xid_actions == {
        63: "none",
        94: "reset_gpu",
    }
    with pytest.raises(InventoryError, match=r"^n1: clustercheck_xid_actions: Xid 63: 'drain' is not one of none"):
        node_from_vars("n1", {"clustercheck_xid_actions": {63: "drain"}})
    with pytest.raises(InventoryError, match="'sixty' is not an Xid code"):
        node_from_vars("n1", {"clustercheck_xid_actions": {"sixty": "none"}})


# Xids in time


def test_xids_before_a_gpu_reset_are_history_not_judged():
    """The kvm list's guest log (Xid 119 thirteen times on PCI:0000:00:06, whose UUID its "GPU at PCI" line
    names), then the reset acknowledgement NVIDIA's NVSentinel logs for that GPU."""
    result = gpu_xid(probed("composed-xid119-then-gpu-reset.log"))
    assert result.status is Status.PASS
    assert "no Xid since boot" in result.message
    assert "older, not judged: Xid 119 13 time(s) on PCI:0000:00:06" in result.message
    assert "before the GPU's reset" in result.message
    assert result.data["history"][119]["count"] == 13


def test_without_the_reset_the_same_xids_fail_with_when_they_were_logged():
    result = gpu_xid(probed("xid119-kvm-list-2022.log"))
    assert result.status is Status.FAIL
    assert (
        "Xid 119 (GSP RPC Timeout; cause: driver) 13 time(s) on PCI:0000:00:06 "
        "first at 113.669216 s after boot, last at 113.672787 s after boot" in result.message
    )
    assert "GPU reset executed" in result.remediation  # how a reset is made to count


def test_xids_before_the_drivers_last_load_are_history_and_those_after_it_judged():
    """gpud's dmesg (Xid 13, and 109 which calls for a GPU reset), then akash's from the driver's load on."""
    result = gpu_xid(probed("composed-xid109-then-driver-load.log", source="dmesg"))
    assert result.status is Status.WARN  # 43, 31, 94 after the load: none takes the GPU out
    assert "4 Xid error(s) since the driver loaded at Sun Jul 28 09:15:27 2024 (dmesg)" in result.message
    assert "older, not judged: Xid 13 3 time(s) on PCI:0000:cb:00" in result.message
    assert "Xid 109 1 time(s) on PCI:0000:cb:00 (last at Fri Aug 30 11:43:14 2024, before the driver's load" in (
        result.message
    )
    assert set(result.data["xids"]) == {31, 43, 94} and set(result.data["history"]) == {13, 109}


def test_the_time_each_line_was_logged_is_read_in_every_format():
    stamps = {
        "xid48-gpu-operator-1146.log": "Dec  2 10:43:35",  # syslog, with the kernel's own [seconds]
        "xid79-open-gpu-kernel-modules-1151.log": "May 18 19:02:39",  # journal
        "xid43-31-94-akash-support-244.log": "Sun Jul 28 09:15:27 2024",  # dmesg -T
        "xid119-kvm-list-2022.log": "113.669214 s after boot",  # dmesg
        "xid63-ml-engineering.log": None,  # no time
    }
    for name, stamp in stamps.items():
        assert xidlog.logged_at((XID / name).read_text().splitlines()[0]) == stamp, name
    assert xidlog.pci_key("00000000:2B:00.0") == xidlog.pci_key("PCI:0000:2b:00") == "PCI:0000:2b:00"


def test_a_reset_is_matched_to_its_gpu_by_nvidia_smi_where_the_log_does_not_name_it():
    """The H200's nvidia-smi -q names GPU-ccfa6af3-... at 00000000:00:06.0."""
    text = "GPU reset executed: GPU-ccfa6af3-46d8-dca5-4c80-b4c53dec6f44, success: true"
    resets = xidlog.gpu_resets(text, {"GPU-ccfa6af3-46d8-dca5-4c80-b4c53dec6f44": "00000000:00:06.0"})
    assert list(resets) == ["PCI:0000:00:06"]
    assert xidlog.gpu_resets(text.replace("true", "false")) == {}  # a reset that failed marks nothing


def test_the_probe_sends_the_lines_that_mark_time_and_reads_the_reset_acknowledgements_of_the_journal():
    answer = probed("composed-xid109-then-driver-load.log")
    assert any("loading NVIDIA UNIX" in line for line in answer["lines"])
    assert any("NVRM: GPU at PCI:" in line for line in answer["lines"])
    assert "nvidia-peermem" not in "\n".join(answer["lines"])
    journal = node.KERNEL_LOGS[0]
    assert journal[0] == "journalctl" and "-b" in journal and "-k" not in journal  # -k would AND the match
    assert journal[-3:] == ["_TRANSPORT=kernel", "+", "SYSLOG_IDENTIFIER=nvsentinel-gpu-reset"]


def test_a_driver_load_amid_more_xid_lines_than_are_sent_back_is_kept(tmp_path):
    """Real lines repeated: the kvm log's Xid 119 line 300 times, akash's driver load line, the Xid line 300 times
    more. The probe sends back the first and last 200 matching lines, and the load line wherever it is."""
    xid = (XID / "xid119-kvm-list-2022.log").read_text().splitlines()[2]
    load = (XID / "xid43-31-94-akash-support-244.log").read_text().splitlines()[0]
    log = tmp_path / "kernel.log"
    log.write_text("\n".join([xid] * 300 + [load] + [xid] * 300) + "\n")
    answer = matching_lines(["cat", str(log)], node.XID_MARKS, always=node.TIME_MARKS)
    assert len(answer["lines"]) == 401 and answer["lines"][200] == load and answer["read"] == 601
