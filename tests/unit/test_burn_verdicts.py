"""Burn verdicts that a healthy GPU passes (issue 52, section 3), on the recorded H100 line under load with single
fields edited as each test says (test_burn_checks.recorded): throttle reasons judged on a GPU's samples under its own
load only, HW Slowdown (0x8) only when it lasts, a GPU another tenant holds at the start a WARN naming what holds it,
a hung GPU named with its phase, the load's own product compared during the load and across the GPUs. Each test
names the old verdict it changes."""

from __future__ import annotations

from test_burn_checks import answer, judged, smi_line

from clustercheck.checks import gpuburn
from clustercheck.facts.burn import GpuBurn
from clustercheck.model import Status

BUS = [f"00000000:{0x18 + i:02X}:00.0" for i in range(4)]
IDLE = {"clocks.sm": "345", "clocks_event_reasons.active": "0x0000000000000001"}  # the recorded idle line's


def started(raw: dict, began: dict[int, float], seconds: float = 60) -> dict:
    """RAW with each GPU's load begun at BEGAN[index] (else at 2 s) and ended SECONDS later."""
    for g in raw["gpus"]:
        g["load_began"] = began.get(g["index"], 2.0)
        g["load_ended"] = g["load_began"] + seconds
    return raw


def raw_with(edits, began: dict[int, float], gpus: int = 4) -> dict:
    from clustercheck.remote import gpuburn as program

    raw = answer(gpus=gpus)
    raw["smi"] = {
        "fields": list(program.QUERY),
        "samples": [
            {"t": t, "lines": [smi_line(i, BUS[i], **edits(t, i)) for i in range(gpus)]} for t in range(0, 101, 10)
        ],
    }
    return started(raw, began)


def test_a_gpu_whose_load_began_late_is_judged_from_its_own_start_not_the_programs():
    """GPU 1's context took 35 s to start: its samples at 0 to 30 s are idle (345 MHz, GpuIdle). Before, every
    sample after 10 s of the program counted as under load: its median clock fell to 59% of its peers', a WARN."""
    raw = raw_with(lambda t, i: IDLE if i == 1 and t <= 30 else {}, {1: 35.0})
    found = judged("gpu.burn.clocks", raw)
    assert found.status is Status.PASS, found.message
    under_load = judged("gpu.burn.throttle", raw).data["gpus"][BUS[1]]["samples_under_load"]
    assert under_load == 5  # 50 to 90 s: from 35 s + 10 s to settle, to 95 s


def test_hw_slowdown_before_a_gpu_s_load_is_not_judged():
    """HW Slowdown (0x8) in the samples while GPU 0 was still starting (NVML: also reported during a P-state or
    clock change). Before: a FAIL."""
    raw = raw_with(lambda t, i: {"clocks_event_reasons.active": "0x8"} if i == 0 and t <= 10 else {}, {0: 12.0})
    assert judged("gpu.burn.throttle", raw).status is Status.PASS


def test_a_short_hw_slowdown_under_load_is_a_warn_and_a_lasting_one_a_fail():
    """One sample of 0x8 under load is a WARN that says why (before: a FAIL); 0x8 in most samples under load is a
    FAIL naming the GPU."""
    once = raw_with(lambda t, i: {"clocks_event_reasons.active": "0x8"} if i == 2 and t == 40 else {}, {})
    found = judged("gpu.burn.throttle", once)
    assert found.status is Status.WARN
    assert "GPU 2 (00000000:1A:00.0): hw_slowdown in 1 of 5 samples under load" in found.message
    assert "P-state or clock change" in found.message
    lasting = raw_with(lambda t, i: {"clocks_event_reasons.active": "0x8"} if i == 2 and t >= 20 else {}, {})
    found = judged("gpu.burn.throttle", lasting)
    assert found.status is Status.FAIL and "GPU 2 (00000000:1A:00.0): hw_slowdown in 5 of 5" in found.message


def test_hw_slowdown_for_a_minute_on_end_of_a_long_burn_is_a_fail():
    raw = answer(gpus=2, seconds=600)
    from clustercheck.remote import gpuburn as program

    def line(t, i):
        return smi_line(i, BUS[i], **({"clocks_event_reasons.active": "0x8"} if i == 1 and 300 <= t <= 370 else {}))

    raw["smi"] = {
        "fields": list(program.QUERY),
        "samples": [{"t": t, "lines": [line(t, i) for i in range(2)]} for t in range(0, 601, 10)],
    }
    found = judged("gpu.burn.throttle", started(raw, {}, 600))
    assert found.status is Status.FAIL and "GPU 1" in found.message  # 8 of 58 samples, but 70 s on end


def test_out_of_memory_at_the_start_is_a_warn_naming_what_holds_the_gpu():
    """GPU 3 ran out of memory allocating the load's matrices: another tenant holds it. Before: a FAIL."""
    raw = raw_with(lambda t, i: {"memory.used": "79000"} if i == 3 else {}, {})
    raw["gpus"][3] = {
        "index": 3,
        "bus_id": BUS[3],
        "name": "NVIDIA H100 80GB HBM3",
        "phase": "allocating the load's matrices",
        "error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 128.00 MiB",
    }
    burn = GpuBurn.from_answer(raw)
    found = gpuburn.judge_load(burn, {BUS[3]: ["pid 4242 python (user alice)"]})
    assert found.status is Status.WARN
    assert "GPU 3 (00000000:1B:00.0): could not start the load, the GPU is held" in found.message
    assert "held by pid 4242 python (user alice)" in found.message
    unseen = gpuburn.judge_load(burn, {})
    assert "79000 MiB used with no process nvidia-smi can see" in unseen.message
    busy = dict(raw["gpus"][3], error="AcceleratorError: CUDA error: CUDA-capable device(s) is/are busy or unavailable")
    raw["gpus"][3] = busy
    assert gpuburn.judge_load(GpuBurn.from_answer(raw), {}).status is Status.WARN


def test_a_hung_gpu_is_a_fail_named_with_what_it_was_doing_and_the_others_figures_are_kept():
    """Before, a hung GPU's entry had no figure and no error: the load PASSed without it."""
    raw = raw_with(lambda t, i: {}, {})
    raw["gpus"][1] = {"index": 1, "bus_id": BUS[1], "name": "NVIDIA H100 80GB HBM3", "phase": "load", "hung": True}
    found = judged("gpu.burn.load", raw)
    assert found.status is Status.FAIL
    assert "GPU 1 (00000000:19:00.0): did not finish (load), hung" in found.message
    assert [r["tflops"] for r in found.data["gpus"]] == [650.0, None, 650.0, 650.0]


def test_a_product_that_changes_during_the_load_or_differs_from_its_peers_is_silent_data_corruption():
    """Before, only the fixed computation before and after was compared: both PASSed."""
    raw = raw_with(lambda t, i: {}, {})
    for g in raw["gpus"]:
        g |= {"load_hash": "d" * 64, "load_checks": 7, "load_mismatches": 0}
    raw["gpus"][2]["load_mismatches"] = 2
    found = judged("gpu.burn.sdc", raw)
    assert found.status is Status.FAIL
    assert "GPU 2 (00000000:1A:00.0): its product changed during the load in 2 of 7 checks" in found.message
    raw["gpus"][2]["load_mismatches"] = 0
    raw["gpus"][0]["load_hash"] = "e" * 64
    found = judged("gpu.burn.sdc", raw)
    assert found.status is Status.FAIL and "GPU 0 (00000000:18:00.0): its load's product differs" in found.message
    raw["gpus"][0]["load_hash"] = "d" * 64
    healthy = judged("gpu.burn.sdc", raw)
    assert healthy.status is Status.PASS and "the load's product alike in 28 check(s) during it" in healthy.message


def test_a_gpu_nvidia_smi_could_not_read_in_some_samples_is_named():
    """nvidia-smi 610 printed, for a GPU fallen off the bus, this line among the others (tests/unit/data/README.md).
    Before, the line was left out silently and the throttle check PASSed."""
    line = "Unable to determine the device handle for GPU1: 0000:34:00.0: Unknown Error"
    raw = raw_with(lambda t, i: {}, {}, gpus=2)
    for s in raw["smi"]["samples"][5:]:
        s["lines"].append(line)
        s["error"] = f"nvidia-smi exit 15: {line}"
    found = judged("gpu.burn.throttle", raw)
    assert found.status is Status.WARN
    assert f"nvidia-smi could not read the GPU at 00000000:34:00.0 in 6 of 11 samples: {line}" in found.message


def test_a_mig_instance_s_burn_says_it_loaded_one_slice():
    raw = raw_with(lambda t, i: {}, {}, gpus=1)
    raw["gpus"][0]["name"] = "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    found = judged("gpu.burn.load", raw)
    assert found.status is Status.PASS and "MIG instance(s) 1g.10gb" in found.message
    assert "loaded those slices only" in found.message and "nvidia-smi -mig 0" in found.message
