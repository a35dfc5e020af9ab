"""The Lightning worker for real: three torchrun agents on this machine stand in for three nodes, each started with
the command line and environment clustercheck.stages.launch builds for a node, gloo ranks over loopback."""

from __future__ import annotations

import json
from pathlib import Path

import localjob

from clustercheck.checks import lightning
from clustercheck.model import Status
from clustercheck.stages import launch


def test_lightning_over_three_agents_matches_a_single_process_lightning_run(tmp_path):
    job = localjob.run_job(
        tmp_path, "lightning", nnodes=3, nproc=1, master_port=29694, worker_args=["--num-nodes", "3", "--devices", "1"]
    )
    assert job.exit_codes == [0, 0, 0], job.logs
    result = lightning.evaluate(job.records, job.world_size, num_nodes=3)
    assert result.status is Status.PASS, result.message
    assert sorted(r["seen"]["node_rank"] for r in job.records) == [0, 1, 2]
    assert result.data["reference_losses"][-1] < result.data["reference_losses"][0]  # it learned something
    # The single-process reference ran in rank 0's own process, without torchrun's environment.
    rank0 = next(r for r in job.records if r["rank"] == 0)
    assert rank0["reference"]["seen"]["world_size"] == 1
    assert rank0["reference"]["seen"]["strategy"] == "SingleDeviceStrategy"
    # The ranks told the watchdog their steps (a start of minutes is judged by its CPU; training, by its steps).
    beats = [
        beat
        for plan in job.launches
        for beat in (Path(launch.output_dir(plan.node.run_dir, "lightning")) / "heartbeat").glob("rank-*.json")
    ]
    assert len(beats) == job.world_size, beats
    for beat in beats:
        last = json.loads(beat.read_text())
        phases = ("lightning fit", "the single-process reference")
        assert last["step"] >= 1 and last["phase"].startswith(phases), last
