"""Judging DDP equivalence, on records from real 3-rank gloo runs (tests/unit/records/ddp-*.json)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from wording import says

from clustercheck.checks import ddp
from clustercheck.model import Status

RECORDS = Path(__file__).parent / "records"


def load(name: str) -> list[dict]:
    return json.loads((RECORDS / name).read_text())


def test_an_equivalent_run_passes_with_the_documented_data():
    result = ddp.evaluate(load("ddp-pass.json"), world_size=3)
    assert result.status is Status.PASS, result.message
    for key in (
        "max_abs_param_diff",
        "max_rel_param_diff",
        "reference_accuracy",
        "ddp_accuracy",
        "world_size",
        "backend",
        "steps",
        "scaling_efficiency",
    ):
        assert key in result.data
    assert result.data["world_size"] == 3 and result.data["backend"] == "gloo" and result.data["steps"] == 20
    assert result.data["max_abs_param_diff"] < 1e-12
    assert result.data["scaling_efficiency"] > 0
    assert "all ranks bit-identical" in result.message
    # The efficiency says what it is of: the rates it comes from, and this check's tiny model, not the user's.
    assert "samples/s on 3 ranks vs" in result.message and "tiny model" in result.message


def test_a_rank_with_another_learning_rate_is_named_with_the_step():
    result = ddp.evaluate(load("ddp-lr.json"), world_size=3)
    assert result.status is Status.FAIL
    assert result.data["disagreeing_ranks"] == [2]
    assert result.data["ranks_part_at_step"] == 1
    assert result.data["curves_part_at_step"] == 2
    assert "rank 2 (" in result.message and "from step 1" in result.message
    assert "parts from the single-process reference at step 2" in result.message


def test_a_rank_with_another_data_seed_is_named_and_the_curves_part_at_step_one():
    result = ddp.evaluate(load("ddp-seed.json"), world_size=3)
    assert result.status is Status.FAIL
    assert result.data["ranks_with_different_data"] == [1]
    assert result.data["curves_part_at_step"] == 1
    assert "rank 1 (" in result.message and "different training data" in result.message


def test_tolerances_decide_float32_and_float64_differently():
    records = load("ddp-pass.json")
    records[0]["max_abs_param_diff"] = 5e-6
    records[0]["max_rel_param_diff"] = 5e-6
    assert ddp.evaluate(records, 3).status is Status.FAIL  # float64: far beyond rounding
    for r in records:
        r["dtype"] = "float32"
    assert ddp.evaluate(records, 3).status is Status.PASS  # float32 on GPUs: within rounding


def test_a_loss_gap_beyond_tolerance_names_the_step():
    records = load("ddp-pass.json")
    records[0]["losses"][6] += 1e-6
    result = ddp.evaluate(records, 3)
    assert result.status is Status.FAIL
    assert result.data["curves_part_at_step"] == 7


def test_a_failed_rank_names_its_host_and_error():
    records = load("ddp-pass.json")
    records[1] = {"rank": 1, "host": "node2", "ok": False, "error": "RuntimeError: Connection reset by peer"}
    result = ddp.evaluate(records, 3)
    assert result.status is Status.FAIL
    assert "rank 1 on node2: RuntimeError: Connection reset by peer" in result.message


def test_a_missing_rank_fails():
    result = ddp.evaluate(load("ddp-pass.json")[:2], world_size=3)
    assert result.status is Status.FAIL and result.data["missing_ranks"] == [2]


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ([1.0, 2.0], [1.0, 2.0], None),
        ([1.0, 2.1], [1.0, 2.0], 2),
        ([1.0], [1.0, 2.0], 2),
        ([300.0], [300.0 + 1e-8], None),
    ],
)
def test_first_parting_step(a, b, expected):
    assert ddp.first_parting_step(a, b, 1e-9) == expected


def test_the_majority_defines_the_odd_rank_out():
    records = [
        {"rank": 0, "final_hash": "a", "param_hashes": ["x", "a"]},
        {"rank": 1, "final_hash": "b", "param_hashes": ["x", "b"]},
        {"rank": 2, "final_hash": "b", "param_hashes": ["x", "b"]},
    ]
    assert ddp.disagreeing_ranks(records) == ([0], 2)


def test_a_checkpoint_round_trip_that_resumes_bit_for_bit_passes_with_size_and_times():
    result = ddp.evaluate_checkpoint(load("ddp-pass.json"), world_size=3)
    assert result.status is Status.PASS, result.message
    assert result.data["step"] == 10 and result.data["steps"] == 20
    assert result.data["bytes"] > 0 and result.data["save_seconds"] >= 0 and result.data["load_seconds"] >= 0
    assert says(result.data["via"], "sent", "rank 0")
    assert "KiB saved by rank 0 at step 10" in result.message and "bit for bit" in result.message


def test_a_rank_that_loads_a_perturbed_checkpoint_is_named():
    records = load("ddp-checkpoint-perturbed.json")
    result = ddp.evaluate_checkpoint(records, world_size=3)
    assert result.status is Status.FAIL
    assert result.data["ranks_loading_other_state"] == [2]
    assert "rank 2 (" in result.message and "loaded state different from what rank 0 saved" in result.message
    assert ddp.evaluate(records, world_size=3).status is Status.PASS  # the training itself was equivalent


def test_a_resumed_run_that_parts_from_the_uninterrupted_one_names_the_rank_and_step():
    records = copy.deepcopy(load("ddp-pass.json"))
    records[1]["checkpoint"]["param_hashes"][3] = "0" * 16  # rank 1's 4th resumed step (step 14) differs
    result = ddp.evaluate_checkpoint(records, world_size=3)
    assert result.status is Status.FAIL
    assert result.data["ranks_resuming_differently"] == [1]
    assert "resumed differently from the uninterrupted run from step 14" in result.message


def test_a_checkpoint_round_trip_without_records_from_every_rank_fails():
    records = [r for r in load("ddp-pass.json") if r["rank"] != 1]
    result = ddp.evaluate_checkpoint(records, world_size=3)
    assert result.status is Status.FAIL and "rank(s) 1" in result.message


def test_a_run_too_short_for_a_half_way_skips_the_checkpoint():
    records = copy.deepcopy(load("ddp-pass.json"))
    for r in records:
        r["steps"] = 1
        del r["checkpoint"]
    assert ddp.evaluate_checkpoint(records, world_size=3).status is Status.SKIP
