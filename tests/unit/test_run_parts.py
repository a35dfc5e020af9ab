"""The parts of a run (clustercheck/run/): what the hosts leave in the run's record, why a multi-node stage does
not run, the stop flag, and a pipeline that holds no state of its own beyond its inputs and those parts."""

from __future__ import annotations

import pytest

from clustercheck.config import RunConfig
from clustercheck.facts.parse import Identity
from clustercheck.inventory import Node
from clustercheck.model import Status
from clustercheck.reach import Fanout
from clustercheck.run.abort import Abort
from clustercheck.run.multinode import why_not
from clustercheck.run.pipeline import Pipeline
from clustercheck.run.record import RunRecord
from clustercheck.selection import Selection
from clustercheck.stages import core
from clustercheck.transport import TransportError


def test_a_second_name_of_one_machine_is_checked_as_the_first_and_its_transport_is_dropped():
    record = RunRecord()
    one = Identity("m1", "boot-1", "gpu1")
    record.register("gpu1", object())
    record.register("gpu1-alias", object())
    assert record.first_command("gpu1", one, "/bin/bash") == "gpu1"
    assert record.first_command("gpu1-alias", one, "/bin/bash") == "gpu1"
    assert record.same == {"gpu1-alias": "gpu1"}
    assert list(record.transports) == ["gpu1"]
    no_boot_id = Identity("m1", None, "gpu1")  # nothing to compare: each name is its own machine
    assert record.first_command("gpu1-again", no_boot_id, None) == "gpu1-again"


def test_a_multinode_stage_says_why_it_does_not_run_selection_first_then_the_nodes():
    skipped = Selection(skip=("ddp",))
    assert "ddp" in str(why_not(skipped, "ddp", "node2: not reached"))
    assert why_not(Selection(), "ddp", "node2: not reached") == "node2: not reached"
    assert why_not(Selection(), "ddp", None) is None


def test_a_stopped_run_begins_no_step_and_reports_none():
    shown = []
    abort = Abort(lambda host, stage: shown.append((host, stage)))
    abort.step("gpu1", "facts")
    abort.stop(Fanout(lambda *a: None), RunRecord())
    with pytest.raises(core.Aborted):
        abort.step("gpu1", "gpu")
    assert shown == [("gpu1", "facts")]


def test_the_pipeline_keeps_no_state_of_its_own_the_run_lives_in_its_record(tmp_path):
    """Pipeline's fields are its inputs and its parts, set once: none is replaced or grows during a run."""

    def unreachable(node, run_id, register):
        raise TransportError(f"{node.name}: connection refused")

    nodes = [Node("gpu1", "10.0.0.11"), Node("gpu2", "10.0.0.12")]
    pipeline = Pipeline(nodes, RunConfig(run_dir=tmp_path), Fanout(unreachable))
    before = dict(vars(pipeline))
    assert not [name for name in before if name.startswith("_")]
    assert [name for name, value in before.items() if isinstance(value, dict | list | set)] == ["nodes"]
    outcome = pipeline.run()
    assert vars(pipeline).keys() == before.keys()
    assert all(vars(pipeline)[name] is value for name, value in before.items())
    connect = [r for r in outcome.results if r.name == "connect"]
    assert [(r.host, r.status) for r in connect] == [("gpu1", Status.FAIL), ("gpu2", Status.FAIL)]
    assert set(pipeline.record.results) == {"gpu1", "gpu2"}
