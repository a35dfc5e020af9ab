"""The run's one torch job for real (remote/stages.py): torchrun agents on this machine stand in for nodes, gloo
ranks talk over loopback; every part judged by the checks the stages use, as the run judges them."""

from __future__ import annotations

import json

import localjob

from clustercheck.checks import collectives, ddp, lightning
from clustercheck.inventory import Node
from clustercheck.model import Status
from clustercheck.stages import Member, shared, torchjob

PARTS = {"local": [], "collectives": [], "ddp": [], "lightning": ["--num-nodes", "2", "--devices", "2"]}


def parts_of(job: localjob.JobResult, names) -> torchjob.JobOutcome:
    """The job's records as the controller splits them: per part, each record with its node."""
    ranks = {p.node.name: list(range(p.node_rank * p.nproc, (p.node_rank + 1) * p.nproc)) for p in job.launches}
    for record in job.records:
        record["node"] = next(n for n, r in ranks.items() if record["rank"] in r)
    return {
        name: torchjob.JobOutcome([r for r in job.records if r["part"] == name], job.world_size, "gloo", ranks=ranks)
        for name in names
    }


def test_one_job_runs_every_part_on_one_process_group_and_each_passes(tmp_path):
    job = localjob.run_job(
        tmp_path, "stages", nnodes=2, nproc=2, master_port=29695, worker_args=["--parts", json.dumps(PARTS)]
    )
    assert job.exit_codes == [0, 0], job.logs
    parts = parts_of(job, PARTS)
    for name, part in parts.items():  # every part's record of every rank, in the part's own directory
        assert sorted(r["rank"] for r in part.records) == [0, 1, 2, 3], name
    for node in ("node1", "node2"):
        member = Member(Node(name=node, address="127.0.0.1"), None, None, "127.0.0.1", "lo", None, 0)
        local = shared.local_results(member, parts["local"])
        assert [r.status for r in local] == [Status.PASS] * 3, [r.message for r in local]
        assert all(r.data["world_size"] == 2 for r in local)  # the node's own two ranks
    for result in collectives.evaluate(parts["collectives"].records, 4):
        assert result.status is Status.PASS and result.data["world_size"] == 4, result.message
    result = ddp.evaluate(parts["ddp"].records, 4)
    assert result.status is Status.PASS and result.data["max_abs_param_diff"] < 1e-12, result.message
    assert ddp.evaluate_checkpoint(parts["ddp"].records, 4).status is Status.PASS
    # Lightning on the job's process group, its single-process reference trained by rank 0 in the same process
    fit = lightning.evaluate(parts["lightning"].records, 4, 2)
    assert fit.status is Status.PASS and fit.data["max_abs_param_diff"] < 1e-12, fit.message
    assert {v["cluster_environment"] for v in fit.data["seen"].values()} == {"TorchElasticEnvironment"}
    # one torchrun, one start: each part's time is its own, the job's start is paid once
    assert all(r["seconds"] < 60 for r in job.records)


def test_where_lightning_does_not_import_on_one_node_no_rank_trains_and_the_parts_before_it_stand(tmp_path):
    no_lightning = "import sys\nsys.modules['lightning'] = None\nsys.modules['pytorch_lightning'] = None\n"
    job = localjob.run_job(
        tmp_path,
        "stages",
        nnodes=2,
        nproc=1,
        master_port=29696,
        worker_args=["--parts", json.dumps({"collectives": ["--no-bandwidth"], "lightning": []})],
        faults={"node2": no_lightning},
    )
    assert job.exit_codes == [0, 0], job.logs
    parts = parts_of(job, ("collectives", "lightning"))
    assert all(r.status is Status.PASS for r in collectives.evaluate(parts["collectives"].records, 2))
    said = {r["rank"]: r for r in parts["lightning"].records}
    assert said[0]["import"]["ok"] and not said[1]["import"]["ok"]
    assert "lightning" in said[1]["import"]["error"]
    assert all(r["not_run"] == "Lightning does not import on every rank" and "losses" not in r for r in said.values())
