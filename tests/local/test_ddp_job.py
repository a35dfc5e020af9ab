"""DDP equivalence for real: torchrun agents on this machine stand in for nodes, gloo ranks talk over loopback.

Every agent gets the command line and environment clustercheck.stages.launch builds for a node; a fault (torch
that trains differently) is loaded by one agent's interpreters only, as a broken library on one node would be.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import localjob
import pytest
import torch
from harness import diverging_torch

from clustercheck.checks import ddp
from clustercheck.model import Status
from clustercheck.remote import ddp as ddp_worker
from clustercheck.stages import rootcause


@pytest.fixture(scope="module")
def healthy_job(tmp_path_factory) -> SimpleNamespace:
    """One healthy DDP job over three nodes of one rank each: its records hold both the DDP comparison and the
    checkpoint round trip, which the tests below judge each."""
    path = tmp_path_factory.mktemp("healthy-ddp")
    job = localjob.run_job(path, "ddp", nnodes=3, nproc=1, master_port=29681)
    return SimpleNamespace(job=job, path=path)


def test_ddp_over_three_nodes_matches_single_process_training(healthy_job):
    job = healthy_job.job
    assert job.exit_codes == [0, 0, 0], job.logs
    result = ddp.evaluate(job.records, job.world_size)
    assert result.status is Status.PASS, result.message
    assert result.data["world_size"] == 3
    assert result.data["backend"] == "gloo" and result.data["dtype"] == "float64"
    assert result.data["max_abs_param_diff"] < 1e-12
    assert result.data["reference_accuracy"] == result.data["ddp_accuracy"] > 0.5  # it learned something
    assert result.data["ddp_losses"][-1] < result.data["ddp_losses"][0]
    assert len({r["final_hash"] for r in job.records}) == 1
    assert result.data["scaling_efficiency"] > 0
    # torchrun kept every rank's output on the node
    assert list((healthy_job.path / "node2" / "ddp" / "torchrun-logs").rglob("stderr.log"))


def test_a_node_with_another_learning_rate_fails_naming_its_rank_and_the_step(tmp_path):
    job = localjob.run_job(
        tmp_path,
        "ddp",
        nnodes=3,
        nproc=1,
        master_port=29682,
        faults={"node3": diverging_torch("lr")},
    )
    assert job.exit_codes == [0, 0, 0], job.logs
    result = ddp.evaluate(job.records, job.world_size)
    assert result.status is Status.FAIL
    assert result.data["disagreeing_ranks"] == [2]  # node3's only rank
    assert result.data["ranks_part_at_step"] == 1
    assert result.data["curves_part_at_step"] == 2
    assert "rank 2 (" in result.message and "from step 1" in result.message


def test_a_rank_that_generates_other_data_fails_from_step_one(tmp_path):
    job = localjob.run_job(
        tmp_path,
        "ddp",
        nnodes=1,
        nproc=2,
        master_port=29683,
        worker_args=["--steps", "8"],
        faults={"node1": diverging_torch("data", rank=1)},
    )
    result = ddp.evaluate(job.records, job.world_size)
    assert result.status is Status.FAIL
    assert result.data["ranks_with_different_data"] == [1]
    assert result.data["curves_part_at_step"] == 1
    assert result.data["steps"] == 8


def test_a_global_batch_that_does_not_split_is_reported_by_every_rank(tmp_path):
    job = localjob.run_job(tmp_path, "ddp", nnodes=1, nproc=2, master_port=29684, worker_args=["--global-batch", "7"])
    assert job.exit_codes == [1]
    result = ddp.evaluate(job.records, job.world_size)
    assert result.status is Status.FAIL
    assert "does not split over 2 ranks" in result.message
    # The ranks' own error is in torchrun's output, where the controller quotes it from (torchrun's report has not).
    failure = rootcause.node_failure(job.logs[0])
    assert failure.own and "does not split over 2 ranks" in failure.lines[-1], job.logs[0][-3000:]


def test_a_checkpoint_saved_half_way_resumes_bit_for_bit_and_a_perturbed_load_is_named(healthy_job, tmp_path):
    job = healthy_job.job
    assert job.exit_codes == [0, 0, 0], job.logs
    result = ddp.evaluate_checkpoint(job.records, job.world_size)
    assert result.status is Status.PASS, result.message
    assert not list(healthy_job.path.rglob("checkpoint*.pt"))  # the round trip cleans up after itself

    job = localjob.run_job(
        tmp_path / "bad", "ddp", nnodes=3, nproc=1, master_port=29692, faults={"node2": diverging_torch("checkpoint")}
    )
    assert job.exit_codes == [0, 0, 0], job.logs
    result = ddp.evaluate_checkpoint(job.records, job.world_size)
    assert result.status is Status.FAIL
    assert result.data["ranks_loading_other_state"] == [1]


def test_a_checkpoint_in_a_shared_directory_is_saved_once_and_read_by_every_rank(tmp_path):
    shared = tmp_path / "shared" / ".clustercheck-test"
    job = localjob.run_job(
        tmp_path, "ddp", nnodes=2, nproc=1, master_port=29693, worker_args=["--checkpoint-dir", str(shared)]
    )
    assert job.exit_codes == [0, 0], job.logs
    result = ddp.evaluate_checkpoint(job.records, job.world_size)
    assert result.status is Status.PASS, result.message
    assert result.data["via"] == f"shared directory {shared}"
    assert not shared.exists()  # removed after the round trip


def test_the_first_step_is_not_timed():
    """On an H200 the reference, trained first in the process, took 0.35 s for 20 steps and the DDP run after it
    0.08 s (tests/unit/records/ddp-h200-1rank.json): CUDA loads each kernel at its first launch. The worker leaves
    the first step out of the throughput, so a first step that pays for the process's start does not make the
    reference look slow (a scaling efficiency of 443% on one rank)."""
    args = SimpleNamespace(steps=5, global_batch=8)
    x, y = torch.randn(40, 4), torch.randint(0, 2, (40,))
    dataset = torch.utils.data.TensorDataset(x, y)
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=False)
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, sampler=sampler)
    model = torch.nn.Linear(4, 2)
    first = []

    def slow_first_launch(module, inputs):
        if not first:
            first.append(True)
            time.sleep(0.5)

    model.register_forward_pre_hook(slow_first_launch)
    losses, _, step_seconds = ddp_worker.train(torch, model, loader, sampler, args.steps, 0.1, float, lambda: None)
    assert len(losses) == 5 and first
    assert len(step_seconds) == 4  # one time per step after the first
    seconds = sum(step_seconds)
    assert seconds < 0.5  # the sleep, timed, would be 0.5 s alone
    assert ddp_worker.samples_per_second(args, seconds) == 4 * 8 / seconds
    assert ddp_worker.samples_per_second(SimpleNamespace(steps=1, global_batch=8), seconds) is None
