"""Judge the DDP equivalence worker's per-rank records (pure logic, no I/O).

PASS when, within the tolerances below, DDP over every rank trains the same model as one process on the
full global batch: the same loss at every step, the same final parameters, the same held-out accuracy,
and every rank ends with bit-identical parameters.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

from clustercheck.checks.registry import declare, emit, get
from clustercheck.checks.spread import Spread
from clustercheck.model import CheckResult, Metric, Status

NAME = "ddp_equivalence"
declare(
    NAME,
    stage="ddp",
    scope="cluster",
    proves="DDP across every node trains the same model as one process on the full global batch: the same loss "
    "at every step, the same final parameters (within float rounding), every rank bit-identical",
    fix="Ranks that disagree run different code, data or settings, or compute differently: compare torch/CUDA/NCCL "
    "versions and the environment on their nodes (the consistency checks), and look for faulty GPUs.",
)


@dataclass(frozen=True)
class Tolerance:
    loss: float  # |ddp - reference| per step, relative to max(1, |reference|)
    param_abs: float  # max |ddp - reference| over all parameter elements
    param_rel: float  # max over tensors of max|ddp - reference| / max|reference|
    accuracy: float  # |ddp - reference| held-out accuracy (a fraction)


# Summation order differs between one process and an all_reduce over W ranks, so results are equal only up
# to rounding: float64 rounding (~1e-16) grows to ~1e-13 over the default 20 steps; float32 (~1e-7) to ~1e-5.
# The tolerances leave three to four orders of magnitude of headroom, and are still far below what a wrong
# gradient, learning rate or data slice produces (1e-3 and more after one step).
TOLERANCES = {
    "float64": Tolerance(loss=1e-9, param_abs=1e-9, param_rel=1e-9, accuracy=0.01),
    "float32": Tolerance(loss=1e-4, param_abs=1e-4, param_rel=1e-3, accuracy=0.01),
}


def first_parting_step(a: list[float], b: list[float], tolerance: float) -> int | None:
    """The first step (1-based) where the curves differ by more than TOLERANCE (relative to max(1, |b|))."""
    for step, (x, y) in enumerate(zip(a, b, strict=False), start=1):
        if abs(x - y) > tolerance * max(1.0, abs(y)):
            return step
    if len(a) != len(b):
        return min(len(a), len(b)) + 1
    return None


def disagreeing_ranks(records: list[dict]) -> tuple[list[int], int | None]:
    """Ranks whose final parameters differ from the majority (rank 0's on a tie), and the first step they part."""
    finals = Counter(r["final_hash"] for r in records)
    rank0 = next(r for r in records if r["rank"] == 0)["final_hash"]
    top = max(finals.values())
    majority = rank0 if finals[rank0] == top else finals.most_common(1)[0][0]
    odd = sorted(r["rank"] for r in records if r["final_hash"] != majority)
    if not odd:
        return [], None
    steps = max(len(r["param_hashes"]) for r in records)
    for step in range(steps):
        if len({r["param_hashes"][step] if step < len(r["param_hashes"]) else None for r in records}) > 1:
            return odd, step + 1
    return odd, None


def where(record: dict) -> str:
    """The node of RECORD's rank."""
    return record.get("node") or record.get("host", "?")


def hosts(records: list[dict], ranks: list[int]) -> str:
    by_rank = {r["rank"]: where(r) for r in records}
    return ", ".join(f"rank {r} ({by_rank.get(r, '?')})" for r in ranks)


def incomplete(records: list[dict], world_size: int) -> tuple[str, dict] | None:
    """Why a training job's rank RECORDS are not a complete run (the first failed rank's error, or the ranks that
    sent nothing), with the check data saying so; None when every rank finished."""
    failed = sorted((r for r in records if not r.get("ok")), key=lambda r: r["rank"])
    missing = sorted(set(range(world_size)) - {r["rank"] for r in records})
    if not failed and not missing:
        return None
    cause = (
        f"rank {failed[0]['rank']} on {where(failed[0])}: {failed[0].get('error', 'unknown error')}"
        if failed
        else f"no result from rank(s) {', '.join(map(str, missing))}"
    )
    return cause, {"world_size": world_size, "failed_ranks": [r["rank"] for r in failed], "missing_ranks": missing}


def tolerance_of(rank0: dict) -> Tolerance:
    return TOLERANCES.get(rank0.get("dtype", "float64"), TOLERANCES["float32"])


def against_reference(records: list[dict], rank0: dict, label: str, reference_name: str) -> tuple[list[str], dict]:
    """What every "trains like one process" judgement compares, for the DDP and the Lightning stage alike: ranks
    that end with other parameters (and the step they part), rank 0's loss curve against the single-process
    reference's, and the final parameters against the reference's, within the dtype's tolerances. LABEL names
    the distributed run and REFERENCE_NAME the reference in the messages. Returns (problems, check data)."""
    reference, tol = rank0["reference"], tolerance_of(rank0)
    problems: list[str] = []
    odd, rank_step = disagreeing_ranks(records)
    data: dict = {"tolerance": asdict(tol), "disagreeing_ranks": odd, "ranks_part_at_step": rank_step}
    if odd:
        part = f" from step {rank_step}" if rank_step else ""
        problems.append(f"{hosts(records, odd)} end(s) with parameters different from the other ranks{part}")
    loss_step = first_parting_step(rank0["losses"], reference["losses"], tol.loss)
    data["curves_part_at_step"] = loss_step
    if loss_step:
        i = loss_step - 1
        mine = rank0["losses"][i] if i < len(rank0["losses"]) else None
        ref = reference["losses"][i] if i < len(reference["losses"]) else None
        problems.append(
            f"the {label} loss curve parts from the {reference_name} at step {loss_step} "
            f"({label} {mine}, single process {ref})"
        )
    if rank0["max_abs_param_diff"] > tol.param_abs or rank0["max_rel_param_diff"] > tol.param_rel:
        problems.append(
            f"final parameters differ from the {reference_name} by {rank0['max_abs_param_diff']:.3g} abs / "
            f"{rank0['max_rel_param_diff']:.3g} rel (tolerance {tol.param_abs:g} / {tol.param_rel:g})"
        )
    return problems, data


def _step_spread(steps) -> dict:
    """The DDP step time's median and spread over its timed steps (each the slowest rank's), in seconds, as the
    report's check data holds it (`step_seconds`); nothing from a worker that did not time each step."""
    spread = Spread.of([t for t in steps or [] if isinstance(t, int | float)])
    return {"step_seconds": spread.to_dict()} if spread else {}


PARAM_DIFF = Metric(
    "ddp_max_abs_param_diff",
    "",
    "Largest absolute difference between the DDP model's parameters and the single-process reference's.",
)
EFFICIENCY = Metric(
    "ddp_scaling_efficiency_ratio",
    "ratio",
    "DDP samples per second over world size times the single-process reference's (1 is perfect scaling).",
)


def evaluate(records: list[dict], world_size: int) -> CheckResult:
    if stopped := incomplete(records, world_size):
        cause, data = stopped
        return emit(
            NAME,
            Status.FAIL,
            f"DDP run did not complete: {cause}",
            remediation="Read the rank's output in the run directory (torchrun-logs); the collectives stage shows "
            "whether the ranks can talk at all.",
            data=data,
        )
    rank0 = next(r for r in records if r["rank"] == 0)
    reference = rank0["reference"]
    ref_sps = reference.get("samples_per_s")
    ddp_sps = rank0["ddp"].get("samples_per_s")
    efficiency = ddp_sps / (world_size * ref_sps) if ref_sps and ddp_sps else None
    problems, compared = against_reference(records, rank0, "DDP", "single-process reference")
    data = {
        "max_abs_param_diff": rank0["max_abs_param_diff"],
        "max_rel_param_diff": rank0["max_rel_param_diff"],
        "reference_accuracy": reference["accuracy"],
        "ddp_accuracy": rank0["ddp"]["accuracy"],
        "world_size": world_size,
        "backend": rank0.get("backend"),
        "dtype": rank0.get("dtype"),
        "steps": rank0.get("steps"),
        "global_batch": rank0.get("global_batch"),
        "reference_samples_per_s": ref_sps,
        "ddp_samples_per_s": ddp_sps,
        **_step_spread(rank0["ddp"].get("step_seconds")),
        "scaling_efficiency": efficiency,
        "reference_losses": reference["losses"],
        "ddp_losses": rank0["losses"],
        **compared,
    }
    measures = (*PARAM_DIFF.of(rank0["max_abs_param_diff"]), *EFFICIENCY.of(efficiency))
    data_hashes = Counter(r.get("data_hash") for r in records)
    if len(data_hashes) > 1:
        usual = rank0["data_hash"] if data_hashes[rank0["data_hash"]] >= max(data_hashes.values()) else None
        usual = usual or data_hashes.most_common(1)[0][0]
        odd_data = sorted(r["rank"] for r in records if r.get("data_hash") != usual)
        data["ranks_with_different_data"] = odd_data
        problems.append(f"{hosts(records, odd_data)} generated different training data from the same seed")
    tol = tolerance_of(rank0)
    accuracy_gap = abs(rank0["ddp"]["accuracy"] - reference["accuracy"])
    if accuracy_gap > tol.accuracy:
        problems.append(
            f"held-out accuracy {rank0['ddp']['accuracy']:.3f} (DDP) vs {reference['accuracy']:.3f} (reference)"
        )

    setting = f"{world_size} ranks ({rank0.get('backend')}, {rank0.get('dtype')}), {rank0.get('steps')} steps"
    if problems:
        return emit(
            NAME,
            Status.FAIL,
            f"DDP on {setting} is not equivalent to single-process training: " + "; ".join(problems),
            remediation="Ranks that disagree run different code, data or settings, or compute differently: compare "
            "torch/CUDA/NCCL versions and the environment on their nodes (the consistency checks), and look for "
            "faulty GPUs. A curve that parts at step 1 means the data or model differs from the first step.",
            data=data,
            measures=measures,
        )
    eff = scaling_text(efficiency, ddp_sps, ref_sps, world_size)
    return emit(
        NAME,
        Status.PASS,
        f"DDP on {setting} matches single-process training: max param diff {rank0['max_abs_param_diff']:.2g}, "
        f"accuracy {rank0['ddp']['accuracy']:.3f} vs {reference['accuracy']:.3f}, all ranks bit-identical{eff}",
        data=data,
        measures=measures,
    )


def scaling_text(efficiency: float | None, ddp_sps: float | None, ref_sps: float | None, world_size: int) -> str:
    """The scaling efficiency with what it is of: this check's own model, a few small layers, whose every step is
    mostly communication, so a low figure is usual and says nothing of how a real model scales."""
    if efficiency is None or not ddp_sps or not ref_sps:
        return ""
    return (
        f", scaling efficiency {efficiency:.0%} ({ddp_sps:.0f} samples/s on {world_size} ranks vs {ref_sps:.0f} in one "
        "process; of this check's tiny model, whose steps are mostly communication: no forecast of your training's)"
    )


CHECKPOINT = "checkpoint"
declare(
    CHECKPOINT,
    stage="ddp",
    scope="cluster",
    proves="a checkpoint saved by global rank 0 alone half-way through the DDP run loads on every rank (from "
    "--shared-dir, else sent from rank 0) with the state that was saved, and training resumed from it is "
    "bit-identical to the uninterrupted run",
    fix="A rank that loads other state reads another file: check that --shared-dir is the same filesystem on every "
    "node (the data.shared_dir check), that nothing else writes there, and the node's storage; a resumed run that "
    "parts from the uninterrupted one means state the checkpoint does not carry (optimizer, data order).",
)


def evaluate_checkpoint(records: list[dict], world_size: int) -> CheckResult:
    """The checkpoint round trip of the DDP worker's records: every rank loaded what rank 0 saved, and the resumed
    run's losses and parameters equal the uninterrupted run's bit for bit."""
    mine = [r for r in records if r.get("ok") and "checkpoint" in r]
    if records and all(r.get("ok") for r in records) and all(r.get("steps", 0) < 2 for r in records):
        return get(CHECKPOINT).not_run(None, "a DDP run of fewer than 2 steps has no half-way")
    if len(mine) < world_size or not any(r["rank"] == 0 for r in mine):
        return _incomplete(records, mine, world_size)
    saved = next(r for r in mine if r["rank"] == 0)["checkpoint"]
    data = _round_trip(mine, world_size)
    problems = _load_problems(records, mine, saved.get("saved_hash"), data) + _resume_problems(records, mine, data)
    kib = (data["bytes"] or 0) / 1024
    how = (
        f"{kib:.1f} KiB saved by rank 0 at step {data['step']} of {data['steps']} in {data['save_seconds']:.3f} s, "
        f"loaded by {world_size} ranks ({data['via']}) in at most {data['load_seconds']:.3f} s"
    )
    if problems:
        return emit(
            CHECKPOINT,
            Status.FAIL,
            f"checkpoint round trip: {'; '.join(problems)} ({how})",
            data=data,
        )
    return emit(
        CHECKPOINT,
        Status.PASS,
        f"checkpoint round trip: {how}; the resumed run equals the uninterrupted run bit for bit",
        data=data,
    )


def _incomplete(records: list[dict], mine: list[dict], world_size: int) -> CheckResult:
    """The FAIL of a round trip that not every rank (MINE: those that made one) reported, with the first failed
    rank's error."""
    missing = sorted(set(range(world_size)) - {r["rank"] for r in mine})
    failed = sorted(r["rank"] for r in records if not r.get("ok"))
    why = f"no round trip from rank(s) {', '.join(map(str, missing))}"
    if failed:
        first = next(r for r in records if r["rank"] == failed[0])
        why += f" (rank {first['rank']} on {first.get('host', '?')}: {first.get('error', 'unknown error')})"
    return emit(
        CHECKPOINT,
        Status.FAIL,
        f"checkpoint round trip did not complete: {why}",
        remediation="Read the rank's output in the run directory (hosts/<node>/torch.torchrun.log, and its record in "
        "hosts/<node>/torch/ddp/).",
        data={"world_size": world_size, "missing_ranks": missing, "failed_ranks": failed},
    )


def _round_trip(mine: list[dict], world_size: int) -> dict:
    """What the round trip was: rank 0's save (its step, size and time) and the slowest rank's load and transfer."""
    rank0 = next(r for r in mine if r["rank"] == 0)
    saved = rank0["checkpoint"]
    return {
        "step": saved["step"],
        "steps": rank0.get("steps"),
        "bytes": saved.get("bytes"),
        "save_seconds": saved.get("save_seconds"),
        "load_seconds": max(r["checkpoint"]["load_seconds"] for r in mine),
        "transfer_seconds": max(r["checkpoint"]["transfer_seconds"] for r in mine),
        "via": f"shared directory {saved['shared_dir']}" if saved.get("shared_dir") else "sent from rank 0",
        "world_size": world_size,
    }


def _load_problems(records: list[dict], mine: list[dict], saved_hash: str | None, data: dict) -> list[str]:
    """The ranks that could not load the checkpoint, or loaded other state than rank 0 saved (SAVED_HASH), into
    DATA too."""
    problems = []
    unloaded = sorted(r["rank"] for r in mine if "load_error" in r["checkpoint"])
    data["ranks_failing_to_load"] = unloaded
    for r in mine:
        if r["rank"] in unloaded:
            problems.append(f"{hosts(records, [r['rank']])} could not load it: {r['checkpoint']['load_error']}")
    odd_load = sorted(
        r["rank"] for r in mine if "loaded_hash" in r["checkpoint"] and r["checkpoint"]["loaded_hash"] != saved_hash
    )
    data["ranks_loading_other_state"] = odd_load
    if odd_load:
        problems.append(f"{hosts(records, odd_load)} loaded state different from what rank 0 saved")
    return problems


def _resume_problems(records: list[dict], mine: list[dict], data: dict) -> list[str]:
    """The ranks whose resumed run differs from the uninterrupted one (into DATA too), with the step where the first
    of them parted; not judged when a rank could not load the checkpoint."""
    step = data["step"]
    odd_resume = []
    for r in mine if not data["ranks_failing_to_load"] else []:
        resumed = r["checkpoint"]
        if resumed["param_hashes"] != r["param_hashes"][step:] or resumed["losses"] != r["losses"][step:]:
            odd_resume.append(r["rank"])
    data["ranks_resuming_differently"] = odd_resume
    if not odd_resume:
        return []
    first = next(r for r in mine if r["rank"] == odd_resume[0])
    pairs = zip(first["checkpoint"]["param_hashes"], first["param_hashes"][step:], strict=False)
    parted = next((step + i + 1 for i, (a, b) in enumerate(pairs) if a != b), None)
    at = f" from step {parted}" if parted else ""
    return [f"{hosts(records, odd_resume)} resumed differently from the uninterrupted run{at}"]
