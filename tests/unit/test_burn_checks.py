"""The GPUs under load (run --burn): nvidia-smi's --query-gpu CSV parsed on real recorded output (facts/burn.py), and
the gpu.burn.* judgements (checks/gpuburn.py). The judges' inputs are answers in the shape remote/gpuburn.py prints;
their nvidia-smi lines are the recorded H100 line under load with single fields edited (a thermal slowdown, a lower
clock, a moved ECC count, another bus id), and each test says which."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from wording import says

from clustercheck.checks import gpuburn, registry
from clustercheck.commands import cli, options
from clustercheck.exitcodes import ExitCode, UsageError
from clustercheck.facts import burn
from clustercheck.facts.burn import GpuBurn
from clustercheck.model import Status
from clustercheck.remote import gpuburn as program
from clustercheck.selection import Selection

DATA = Path(__file__).parent / "data"
CAPTURE = DATA / "nvidia-smi-query-gpu-h100-gpu-burn-nvidia-gpu-exporter.txt"
GTX1080 = DATA / "nvidia-smi-query-gpu-supported-gtx1080-nvidia-settings-80.txt"
# The name the capture's header gives a field asked for by its other name (its nvidia-smi --help-query-gpu:
# '"clocks.current.sm" or "clocks.sm"'); the header carries each field's unit in brackets ("power.draw [W]").
HEADER_NAMES = {"clocks.sm": "clocks.current.sm"}


def recorded() -> dict[str, str]:
    """The capture's idle and load lines, each projected onto the fields gpuburn asks for (program.QUERY), in its
    order, as nvidia-smi answers a query of those fields: the values verbatim (with their units: the capture was
    taken without nounits)."""
    lines = CAPTURE.read_text().splitlines()
    rows = [line for line in lines if line and not line.startswith("#")]
    out = {}
    for state, (header, row) in zip(("idle", "load"), (rows[0:2], rows[2:4]), strict=True):
        names = [h.strip().split(" [")[0] for h in header.split(",")]
        values = [v.strip() for v in row.split(",")]
        assert len(names) == len(values) == 212
        out[state] = ", ".join(values[names.index(HEADER_NAMES.get(f, f))] for f in program.QUERY)
    return out


def test_the_recorded_h100_lines_parse_idle_and_under_load():
    idle, load = (burn.parse_query(list(program.QUERY), [line])[0] for line in recorded().values())
    assert idle["pci.bus_id"] == "00000000:00:09.0" and idle["index"] == 0
    assert (idle["clocks.sm"], idle["clocks.max.sm"], idle["temperature.gpu"]) == (345, 1980, 41)
    assert (idle["power.draw"], idle["power.limit"]) == (69.85, 700.0)
    assert idle["clocks_event_reasons.active"] == 0x1 and burn.reasons(0x1) == ("gpu_idle",)
    assert (load["clocks.sm"], load["temperature.gpu"], load["power.draw"]) == (1980, 59, 631.95)
    assert load["clocks_event_reasons.active"] == 0 and burn.reasons(0) == ()
    assert (load["ecc.errors.corrected.volatile.total"], load["ecc.errors.uncorrected.volatile.total"]) == (0, 0)


def test_the_older_throttle_reason_field_names_are_read_under_the_new_ones():
    line = recorded()["load"]
    row = burn.parse_query(list(program.OLD_QUERY), [line])[0]
    assert "clocks_throttle_reasons.active" in program.OLD_QUERY and row["clocks_event_reasons.active"] == 0


def test_the_recorded_gtx1080_bitmask_names_every_reason_nvml_defines():
    header, mask = GTX1080.read_text().split()
    assert header == "clocks_throttle_reasons.supported"
    assert burn.reasons(burn.value(mask)) == tuple(burn.REASONS.values())[:9]  # the GTX 1080's driver: 0x1 to 0x100
    assert burn.reasons(0x84) == ("sw_power_cap", "hw_power_brake_slowdown")
    assert burn.reasons(0x1000) == ("0x1000",)  # a bit NVML does not name: by its value


def test_nvml_s_newer_reasons_board_limit_and_reliability_are_named():
    """NVML's nvmlClocksEventReasonBoardLimit (0x200) and nvmlClocksEventReasonReliability (0x400); before, the
    burn's data said "0x200"."""
    assert burn.reasons(0x604) == ("sw_power_cap", "board_limit", "reliability")


@pytest.mark.parametrize("text", ["[N/A]", "[Not Supported]", "N/A", "", "[Unknown Error]"])
def test_a_field_the_gpu_does_not_report_is_none(text):
    assert burn.value(text) is None


def test_a_line_with_another_number_of_fields_is_left_out():
    assert burn.parse_query(["index", "clocks.sm"], ["No devices were found", "0, 1980"]) == [
        {"index": 0, "clocks.sm": 1980}
    ]


def smi_line(index: int = 0, bus: str = "00000000:00:09.0", **edits: str) -> str:
    """The recorded line under load with INDEX, BUS and EDITS (field -> text) put in place of its own."""
    values = [v.strip() for v in recorded()["load"].split(",")]
    edits |= {"index": str(index), "pci.bus_id": bus}
    return ", ".join(edits.get(f, v) for f, v in zip(program.QUERY, values, strict=True))


def answer(gpus: int = 4, seconds: float = 60, lines=None, **more) -> dict:
    """An answer in the shape gpuburn prints: GPUS alike, sampled every 10 s with LINES(t) (default: each GPU's
    recorded line under load)."""
    buses = [f"00000000:{0x18 + i:02X}:00.0" for i in range(gpus)]
    lines = lines or (lambda t: [smi_line(i, b) for i, b in enumerate(buses)])
    entries = [
        {"index": i, "bus_id": b, "name": "NVIDIA H100 80GB HBM3", "iterations": 100, "tflops": 650.0}
        | {"hash_before": "a" * 64, "hash_after": "a" * 64}
        for i, b in enumerate(buses)
    ]
    out = {
        "cuda": True,
        "torch": "2.13.0",
        "cuda_version": "13.0",
        "seconds": seconds,
        "fixed": program.FIXED,
        "gpus": entries,
        "smi": {"fields": list(program.QUERY), "samples": [{"t": t, "lines": lines(t)} for t in range(0, 61, 10)]},
        "xids": {"source": "journalctl -k -b", "before": ["old Xid line"], "after": ["old Xid line"]},
    }
    return out | more


def judged(check: str, raw: dict) -> registry.Finding:
    judge = {
        "gpu.burn.load": gpuburn.judge_load,
        "gpu.burn.throttle": gpuburn.judge_throttle,
        "gpu.burn.clocks": gpuburn.judge_clocks,
        "gpu.burn.ecc": gpuburn.judge_ecc,
        "gpu.burn.xid": gpuburn.judge_xid,
        "gpu.burn.sdc": gpuburn.judge_sdc,
    }[check]
    return judge(GpuBurn.from_answer(raw))


@pytest.mark.parametrize("check", gpuburn.NAMES)
def test_healthy_gpus_under_load_pass_every_check(check):
    found = judged(check, answer())
    assert found.status is Status.PASS, (check, found.message)


def test_the_load_s_figures_are_said():
    found = judged("gpu.burn.load", answer())
    assert says(found.message, "4 GPU(s)", "60 s", "bf16 multiply", "650, 650, 650, 650 TFLOP/s")
    throttle = judged("gpu.burn.throttle", answer()).message
    assert says(throttle, "no protective slowdown", "24 sample(s)", "59 C")  # t=0 is before the load


def test_a_thermal_slowdown_under_load_is_a_fail_naming_the_gpu_and_its_reason():
    def lines(t):  # GPU 2's recorded line with HW thermal slowdown (0x40) and 88 C from 30 s on
        hot = {"clocks_event_reasons.active": "0x0000000000000040", "temperature.gpu": "88"} if t >= 30 else {}
        return [smi_line(i, f"00000000:{0x18 + i:02X}:00.0", **(hot if i == 2 else {})) for i in range(4)]

    found = judged("gpu.burn.throttle", answer(lines=lines))
    assert found.status is Status.FAIL
    assert says(found.message, "hardware protection", "GPU 2 (00000000:1A:00.0)", "hw_thermal_slowdown")
    assert says(found.message, "4 of 6 samples", "88 C")
    assert found.data["gpus"]["00000000:1A:00.0"]["reasons"] == ["hw_thermal_slowdown"]
    assert "cooling" in registry.get("gpu.burn.throttle").result("n1", found).remediation


def test_the_driver_s_thermal_slowdown_is_a_warn_and_the_power_cap_is_not_judged():
    def lines(t):  # GPU 0: SW thermal slowdown (0x20) with the power cap (0x4); GPU 1: the power cap alone
        edits = [{"clocks_event_reasons.active": "0x24"}, {"clocks_event_reasons.active": "0x4"}]
        return [smi_line(i, f"00000000:{0x18 + i:02X}:00.0", **edits[i]) for i in range(2)]

    found = judged("gpu.burn.throttle", answer(gpus=2, lines=lines))
    assert found.status is Status.WARN
    assert "GPU 0 (00000000:18:00.0): sw_thermal_slowdown in 6 of 6 samples" in found.message
    assert "GPU 1" not in found.message and found.data["gpus"]["00000000:19:00.0"]["reasons"] == ["sw_power_cap"]


def test_a_gpu_clocked_well_below_its_peers_under_load_is_named():
    def lines(t):  # GPU 3's SM clock at 1410 MHz instead of the recorded 1980
        return [
            smi_line(i, f"00000000:{0x18 + i:02X}:00.0", **({"clocks.sm": "1410"} if i == 3 else {})) for i in range(4)
        ]

    found = judged("gpu.burn.clocks", answer(lines=lines))
    assert found.status is Status.WARN
    assert says(found.message, "GPU 3 (00000000:1B:00.0)", "1410 MHz", "71%", "median 1980 MHz", "maximum 1980 MHz")


def test_the_clocks_before_the_load_settles_are_not_judged():
    def lines(t):  # every GPU idle at 345 MHz in the first sample (t=0), as recorded idle; GPU 1 idle at 10 s too
        return [
            smi_line(i, f"00000000:{0x18 + i:02X}:00.0", **({"clocks.sm": "345"} if t == 0 else {})) for i in range(2)
        ]

    assert judged("gpu.burn.clocks", answer(gpus=2, lines=lines)).status is Status.PASS


def test_ecc_counts_that_move_during_the_load_are_named():
    def lines(t, kind="uncorrected"):  # GPU 1's volatile count goes from the recorded 0 to 2 at 40 s
        moved = {f"ecc.errors.{kind}.volatile.total": "2"} if t >= 40 else {}
        return [smi_line(i, f"00000000:{0x18 + i:02X}:00.0", **(moved if i == 1 else {})) for i in range(2)]

    found = judged("gpu.burn.ecc", answer(gpus=2, lines=lines))
    assert found.status is Status.FAIL
    assert says(found.message, "ECC errors", "GPU 1 (00000000:19:00.0)", "2 uncorrected")
    corrected = judged("gpu.burn.ecc", answer(gpus=2, lines=lambda t: lines(t, "corrected")))
    assert corrected.status is Status.WARN


def test_an_xid_logged_during_the_load_is_judged_by_the_catalog_and_an_older_one_is_not():
    xid = (DATA / "xid" / "xid79-open-gpu-kernel-modules-1151.log").read_text().splitlines()[1]
    found = judged("gpu.burn.xid", answer(xids={"source": "dmesg", "before": [], "after": [xid]}))
    assert found.status is Status.FAIL and "during the load (dmesg)" in found.message and "Xid 79" in found.message
    unchanged = judged("gpu.burn.xid", answer(xids={"source": "dmesg", "before": [xid], "after": [xid]}))
    assert unchanged.status is Status.PASS
    unread = judged("gpu.burn.xid", answer(xids={"error": "journalctl not found; dmesg: Operation not permitted"}))
    assert unread.status is Status.WARN and "dmesg: Operation not permitted" in unread.message


def test_a_gpu_whose_fixed_result_differs_from_its_peers_is_a_fail():
    raw = answer()
    raw["gpus"][1] |= {"hash_before": "b" * 64, "hash_after": "b" * 64}
    found = judged("gpu.burn.sdc", raw)
    assert found.status is Status.FAIL
    assert says(found.message, "silent data corruption", "GPU 1 (00000000:19:00.0)", "differs from its 3 peer(s)")
    assert "Take the GPU out of service" in registry.get("gpu.burn.sdc").result("n1", found).remediation


def test_a_gpu_whose_result_changes_under_load_is_a_fail_even_alone():
    raw = answer(gpus=1)
    raw["gpus"][0]["hash_after"] = "c" * 64
    found = judged("gpu.burn.sdc", raw)
    assert found.status is Status.FAIL and "after the load its fixed result differs" in found.message


def test_two_gpus_that_disagree_are_both_named_since_neither_is_the_majority():
    raw = answer(gpus=2)
    raw["gpus"][1] |= {"hash_before": "b" * 64, "hash_after": "b" * 64}
    found = judged("gpu.burn.sdc", raw)
    assert found.status is Status.FAIL and "no majority" in found.message and "GPU 0" in found.message


def test_a_gpu_that_failed_under_load_is_a_fail_with_its_error():
    raw = answer()
    raw["gpus"][2] = {"index": 2, "bus_id": "00000000:1A:00.0", "name": "x", "error": "RuntimeError: CUDA error"}
    found = judged("gpu.burn.load", raw)
    assert found.status is Status.FAIL
    assert says(found.message, "failed under load", "GPU 2 (00000000:1A:00.0)", "RuntimeError: CUDA error")


def test_without_nvidia_smi_samples_the_sampled_checks_warn_with_the_reason():
    raw = answer(smi={"error": "nvidia-smi not found"})
    for check in ("gpu.burn.throttle", "gpu.burn.clocks", "gpu.burn.ecc"):
        found = judged(check, raw)
        assert found.status is Status.WARN
        assert says(found.message, "could not be sampled", "nvidia-smi not found")


def test_every_burn_check_skips_without_burn_and_with_the_program_s_reason():
    from clustercheck.facts.model import NodeFacts
    from clustercheck.inventory import Node

    facts = NodeFacts(Node("n1", "10.0.0.1"), "python3", "test")
    for check in gpuburn.NAMES:
        found = registry.get(check).function(facts)
        assert (found.status, found.message) == (Status.SKIP, gpuburn.NOT_ASKED)
    facts = replace(
        facts, gpu_burn=GpuBurn.from_answer({"cuda": False, "reason": "torch sees no CUDA GPU", "gpus": []})
    )
    assert says(registry.get("gpu.burn.sdc").function(facts).message, "torch", "no CUDA GPU")
    facts = replace(facts, gpu_burn=GpuBurn(failure="timed out after 720 s"))
    assert registry.get("gpu.burn.xid").function(facts).status is Status.FAIL


def test_one_glob_selects_every_burn_check_and_only_them():
    names = [c.name for c in registry.node_checks() if c.name.startswith("gpu.burn.")]
    assert tuple(names) == gpuburn.NAMES
    assert gpuburn.wanted(Selection()) and not gpuburn.wanted(Selection(skip=("gpu.burn.*",)))


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("10m", 600), ("1h", 3600), ("300", 300), ("1.5m", 90)])
def test_burn_lengths(text, seconds):
    assert options.burn_seconds(text) == seconds


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("5x", "--burn 5x: give a length such as 90s, 10m or 1h"),
        ("1s", "--burn 1s: give a length from 10s to 24h"),
        ("2d", "--burn 2d: give a length such as 90s, 10m or 1h"),
        ("25h", "--burn 25h: give a length from 10s to 24h"),
    ],
)
def test_a_bad_burn_length_is_one_line_and_a_usage_error(text, said):
    with pytest.raises(UsageError, match=said):
        options.burn_seconds(text)
    result = CliRunner().invoke(cli, ["run", "--hosts", "localhost", "--burn", text], prog_name="clustercheck")
    assert result.exit_code == ExitCode.USAGE_ERROR, result.output
    assert result.output.strip().splitlines() == [f"Error: {said}"]  # click's test runner; main() says clustercheck:


def test_the_core_stage_runs_gpuburn_for_the_length_asked_and_keeps_its_answer(tmp_path):
    import json
    from types import SimpleNamespace

    from fakes import FakeNode

    from clustercheck.facts import collect
    from clustercheck.inventory import Node
    from clustercheck.stages import bundle, gpuwork
    from clustercheck.transport import CommandResult

    raw = json.loads((Path(__file__).parent / "records" / "facts-debian12-localhost.json").read_text())
    facts = collect.build(Node(name="node2", address="node2"), raw, python="/opt/env/bin/python", python_source="x")
    ctx = SimpleNamespace(config=SimpleNamespace(command_timeout=120.0, container=None, burn_seconds=600.0))
    said = json.dumps(answer())
    node = FakeNode("gpunode3", CommandResult(0, f"{said}\n", ""))
    loaded = gpuwork.burn_gpus(facts, node, ctx, tmp_path)
    argv = ["/opt/env/bin/python", bundle.path(node.workdir), "gpuburn", "--seconds", "600"]
    assert node.sent[-1][:2] == (argv, 720.0)  # the length, and the collector's deadline for the rest
    assert len(loaded.gpus) == 4 and len(loaded.samples) == 28
    assert (tmp_path / "gpuburn.json").read_text() == f"{said}\n"
    crashed = FakeNode("gpunode4", CommandResult(None, "", "", timed_out=True))
    facts = replace(facts, gpu_burn=gpuwork.burn_gpus(facts, crashed, ctx, tmp_path))
    found = registry.get("gpu.burn.load").function(facts)
    assert found.status is Status.FAIL
    assert says(found.message, "could not be loaded", "gpuburn", "timed out after 720 s")
