"""Judging the Lightning stage on rank records of real Lightning runs (tests/unit/records/lightning-*.json)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from clustercheck.checks import lightning
from clustercheck.model import Status

RECORDS = Path(__file__).parent / "records"


def load(name: str) -> list[dict]:
    return json.loads((RECORDS / name).read_text())


def test_an_equivalent_lightning_run_passes_with_what_every_rank_saw():
    result = lightning.evaluate(load("lightning-pass.json"), world_size=3, num_nodes=3)
    assert result.status is Status.PASS, result.message
    assert result.data["max_abs_param_diff"] < 1e-12 and result.data["dtype"] == "float64"
    assert "every rank saw world size 3, 3 nodes" in result.message and "TorchElasticEnvironment" in result.message
    assert result.data["lightning"]["version"] == "2.6.6"


def test_a_rank_with_another_learning_rate_is_named():
    result = lightning.evaluate(load("lightning-lr.json"), world_size=3, num_nodes=3)
    assert result.status is Status.FAIL
    assert result.data["disagreeing_ranks"] == [2]
    assert "rank 2 (" in result.message and "parts from the single-process Lightning run at step 2" in result.message


def test_a_node_where_lightning_saw_another_world_names_the_node_and_what_it_saw():
    records = copy.deepcopy(load("lightning-pass.json"))
    for r in records:
        r["node"] = f"node{r['rank'] + 1}"
    records[1]["seen"].update(world_size=1, num_nodes=1, cluster_environment="LightningEnvironment")
    result = lightning.evaluate(records, world_size=3, num_nodes=3)
    assert result.status is Status.FAIL
    assert result.data["nodes_seeing_otherwise"] == ["node2"]
    assert "on node2 Lightning saw otherwise: rank 1 saw world size 1 (torchrun: 3)" in result.message
    assert "node count 1 (torchrun: 3)" in result.message
    assert "cluster environment LightningEnvironment (torchrun: TorchElasticEnvironment)" in result.message


def test_the_job_shape_the_controller_expects_is_what_lightning_must_see():
    # Three ranks, but the controller launched them as one node of three: every rank saw 3 nodes instead.
    result = lightning.evaluate(load("lightning-pass.json"), world_size=3, num_nodes=1)
    assert result.status is Status.FAIL and "saw node count 3 (torchrun: 1)" in result.message


def test_a_failed_rank_names_its_node_and_error():
    records = copy.deepcopy(load("lightning-pass.json"))
    records[2].update(ok=False, error="ModuleNotFoundError: No module named 'lightning'", node="node3")
    result = lightning.evaluate(records, world_size=3, num_nodes=3)
    assert result.status is Status.FAIL
    assert "rank 2 on node3: ModuleNotFoundError" in result.message


def test_lightning_that_does_not_import_is_skip_unless_asked_for():
    answer = {"ok": False, "error": "ModuleNotFoundError: No module named 'lightning'"}
    assert lightning.import_finding(answer, None, required=False).status is Status.SKIP
    finding = lightning.import_finding(answer, None, required=True)
    assert finding.status is Status.FAIL and "--only lightning" in finding.message
    ok = lightning.import_finding({"ok": True, "package": "lightning", "version": "2.6.6"}, None, required=True)
    assert ok.status is Status.PASS and ok.message == "lightning 2.6.6 imports"
