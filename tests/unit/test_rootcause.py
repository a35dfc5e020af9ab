"""The failing rank's own words from a node's torchrun output (recorded outputs, torch 2.13)."""

from __future__ import annotations

from pathlib import Path

from test_torchjob import KILLED, PEER

from clustercheck.stages import rootcause

DATA = Path(__file__).parent / "data" / "torchrun"


def test_the_rank_that_raised_is_quoted_with_its_tracebacks_last_lines_not_torchruns_boilerplate():
    # torchrun's own report on node2 names rank 2 as "Root Cause" (a peer that lost rank 3) and gives no error.
    output = (DATA / "ddp-rank3-raised-node2.log").read_text()
    assert "Root Cause (first observed failure):\n[0]:\n  time      : 2026-11-23_17:35:59\n" in output
    failure = rootcause.node_failure(output)
    assert (failure.rank, failure.local_rank, failure.own) == (3, 1, True)
    assert failure.lines == (
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
    assert failure.text() == "rank 1 (local rank 0): killed by Signal 9 (SIGKILL)"


def test_output_that_names_no_rank_gives_nothing_to_quote():
    assert rootcause.node_failure("/opt/venv/bin/python: No module named torch\n") is None
    assert rootcause.node_failure("") is None
