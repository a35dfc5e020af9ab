"""Judging --shared-dir and --data-path on what `clustercheck_remote.data` answered on real nodes
(tests/unit/records/data-*.json)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from clustercheck.checks import data
from clustercheck.model import Status

RECORDS = Path(__file__).parent / "records"
ORDER = ["node1", "node2", "node3"]


def load(name: str) -> dict:
    return json.loads((RECORDS / name).read_text())


def test_a_data_path_that_differs_on_one_node_names_it_with_what_differs():
    result = data.evaluate_paths(load("data-paths-node3-differs.json"), {}, ORDER)
    assert result.status is Status.FAIL
    assert "/srv/ds differs on node3: total size 9 B (others 6 B), sample hash" in result.message
    assert "/srv/missing does not exist on node1, node2, node3" in result.message
    assert result.data["paths"]["/srv/ds"]["differing_nodes"] == ["node3"]
    assert result.data["paths"]["/srv/ds"]["files"] == 3


def test_the_same_data_on_every_node_passes_with_its_summary():
    answers = copy.deepcopy(load("data-paths-node3-differs.json"))
    answers["node3"] = copy.deepcopy(answers["node1"])
    for answer in answers.values():
        answer["paths"] = [p for p in answer["paths"] if p["path"] == "/srv/ds"]
    result = data.evaluate_paths(answers, {}, ORDER)
    assert result.status is Status.PASS, result.message
    assert "the same on all 3 nodes: /srv/ds (3 files, 6 B, sample" in result.message


def test_a_node_that_did_not_answer_is_named():
    answers = load("data-paths-node3-differs.json")
    del answers["node2"]
    result = data.evaluate_paths(answers, {"node2": "exit 127: python3: not found"}, ORDER)
    assert result.status is Status.FAIL and "node2: exit 127" in result.message


def test_a_shared_directory_that_is_local_on_each_node_is_named():
    result = data.evaluate_shared("/srv/sh", "node1", load("data-shared-local-dirs.json"), {}, "any token")
    assert result.status is Status.FAIL
    assert "node2, node3 do not see the token node1 wrote into /srv/sh" in result.message


def test_one_shared_filesystem_passes_with_its_free_space():
    recorded = load("data-shared-one-filesystem.json")
    result = data.evaluate_shared("/srv/sh", "node1", recorded["answers"], {}, recorded["token"])
    assert result.status is Status.PASS, result.message
    assert "one writable filesystem on all 3 nodes" in result.message and "GiB free" in result.message
    assert set(result.data["free_bytes"]) == set(ORDER)


def test_an_unwritable_shared_directory_fails():
    answers = copy.deepcopy(load("data-shared-one-filesystem.json")["answers"])
    answers["node1"].update(writable=False, error="not writable: Read-only file system")
    del answers["node1"]["wrote"]
    result = data.evaluate_shared("/srv/sh", "node1", answers, {}, "x")
    assert result.status is Status.FAIL and "node1: /srv/sh not writable: Read-only file system" in result.message
