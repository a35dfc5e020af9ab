"""The failing rank's own words from a node's torchrun output, and how every rank ended (recorded outputs, torch
2.13: tests/unit/data/README.md)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from test_checks import recorded_node
from test_torchjob import KILLED, PEER
from wording import says

from clustercheck.stages import rootcause

DATA = Path(__file__).parent / "data" / "torchrun"


def test_the_rank_that_raised_is_quoted_with_its_tracebacks_last_lines_not_torchruns_boilerplate():
    # torchrun's own report on node2 names rank 2 as "Root Cause" (a peer that lost rank 3) and gives no error.
    output = (DATA / "ddp-rank3-raised-node2.log").read_text()
    assert "Root Cause (first observed failure):\n[0]:\n  time      : 2026-11-23_17:35:59\n" in output
    failure = rootcause.node_failure(output)
    assert (failure.rank, failure.local_rank, failure.own) == (3, 1, True)
    assert failure.lines == (  # verbatim: the rank's own traceback lines, found
        'File "/opt/clustercheck/venv/lib/python3.11/site-packages/torch/optim/optimizer.py", line 530, in wrapper',
        "out = func(*args, **kwargs)",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
    )
    assert failure.text().startswith("rank 3 (local rank 1): File ")
    assert "To enable traceback" not in failure.text()


def test_a_rank_that_lost_its_peer_is_quoted_but_not_as_its_own_failure():
    failure = rootcause.node_failure((DATA / "ddp-rank3-raised-node1.log").read_text())
    assert failure.own is False
    assert failure.lines[-1].startswith("RuntimeError: [") and "Connection closed by peer" in failure.lines[-1]
    assert rootcause.node_failure(PEER).own is False


def test_a_killed_rank_is_named_with_its_signal():
    failure = rootcause.node_failure(KILLED)
    assert (failure.rank, failure.local_rank, failure.own) == (1, 0, True)
    assert says(failure.text(), "rank 1 (local rank 0)", "Signal 9 (SIGKILL)")


def test_output_that_names_no_rank_gives_nothing_to_quote():
    assert rootcause.node_failure("/opt/venv/bin/python: No module named torch\n") is None
    assert rootcause.node_failure("") is None


def test_a_rank_that_failed_without_a_traceback_is_quoted_with_its_last_lines():
    """argparse's error (the README's train_ddp.py --steps ten): no traceback, exit code 2; its usage and error
    lines are the failure, not "exit code 2" alone."""
    failure = rootcause.node_failure((DATA / "argparse-invalid-int-localhost.log").read_text())
    assert (failure.rank, failure.local_rank, failure.own) == (1, 1, True)
    assert says(failure.text(), "rank 1 (local rank 1)", "exit code 2", "usage: train_ddp.py [-h]")
    assert says(failure.text(), "train_ddp.py: error: argument --steps: invalid int value: 'ten'")


def test_every_rank_failing_alike_gives_the_scripts_own_exit_status():
    """Rank 1 exited 2, and torchrun stopped rank 0 (SIGTERM) after it had written the same error: alike, 2. Both
    ranks of the CUDA script exited 1: 1."""
    argparse = rootcause.rank_ends((DATA / "argparse-invalid-int-localhost.log").read_text())
    assert (argparse[0].exitcode, argparse[1].exitcode) == (-15, 2)
    assert rootcause.same_status({"localhost": argparse}, {"localhost": 2}) == 2
    cuda = rootcause.rank_ends((DATA / "cuda-script-cpu-torch-localhost.log").read_text())
    assert rootcause.same_status({"localhost": cuda}, {"localhost": 2}) == 1
    # A rank that did not write the error, a rank not heard of, another exit code: not alike.
    silent = {0: rootcause.RankEnd(0, 0, -15, ("step 3",)), 1: argparse[1]}
    assert rootcause.same_status({"localhost": silent}, {"localhost": 2}) is None
    assert rootcause.same_status({"localhost": argparse}, {"localhost": 3}) is None
    other = {**cuda, 1: rootcause.RankEnd(1, 1, 2, cuda[1].said)}
    assert rootcause.same_status({"localhost": other}, {"localhost": 2}) is None


def test_a_rank_aborted_at_its_exit_is_quoted_with_what_is_known_of_it():
    """node2's rank 3 died of SIGABRT after "terminate called without an active exception" (torch 2.13's gloo at
    shutdown, as the issue quotes it); its peers on node2 were stopped by torchrun, node1's ranks ended well."""
    failure = rootcause.node_failure((DATA / "abort-at-exit-node2.log").read_text())
    assert (failure.rank, failure.local_rank, failure.own, failure.signal) == (3, 0, True, 6)
    assert says(failure.text(), "rank 3 (local rank 0)", "Signal 6 (SIGABRT)", "terminate called without an active")
    cause, at_exit = rootcause.known_cause(failure)
    assert at_exit and cause.startswith("C++'s std::terminate with no exception in flight")
    ends = {n: rootcause.rank_ends((DATA / f"abort-at-exit-{n}.log").read_text()) for n in ("node1", "node2")}
    assert [e.failed for e in ends["node2"].values()] == [True, False, False]
    assert ends["node1"][0].said == ("sum of the ranks: 15",)  # verbatim: the rank's own line
    assert not ends["node1"][0].failed
    assert rootcause.same_status(ends, {"node1": 3, "node2": 3}) is None  # one rank failed, not every one
    assert rootcause.known_cause(rootcause.node_failure(KILLED)) is None


def test_a_cuda_script_on_a_node_without_a_gpu_and_a_cpu_torch_says_so():
    """The script's torch.cuda.set_device on the development machine's CPU-only torch 2.13 (recorded facts of the
    same machine: no GPU, torch 2.13.0+cpu)."""
    failure = rootcause.node_failure((DATA / "cuda-script-cpu-torch-localhost.log").read_text())
    raised = "AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'"
    assert failure.lines[-1] == raised  # verbatim: the rank's own last line
    facts = recorded_node("facts-debian12-localhost.json")
    cpu_build = rootcause.without_cuda(failure, "localhost", facts)
    assert says(cpu_build, "localhost has no GPU", "torch 2.13.0+cpu", "CPU build", "asks for CUDA")
    argparse = rootcause.node_failure((DATA / "argparse-invalid-int-localhost.log").read_text())
    assert rootcause.without_cuda(argparse, "localhost", facts) is None  # not about CUDA
    cuda_torch = replace(facts, torch=replace(facts.torch, version="2.13.0+cu128", cuda="12.8"))
    no_gpu = rootcause.without_cuda(failure, "localhost", cuda_torch)
    assert says(no_gpu, "torch 2.13.0+cu128 (CUDA 12.8)", "no GPU on localhost", "nvidia-smi found none", "for CUDA")
    usable = replace(cuda_torch, torch=replace(cuda_torch.torch, cuda_available=True, device_count=1))
    assert rootcause.without_cuda(failure, "localhost", usable) is None
