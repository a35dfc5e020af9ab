"""One way to skip (issue 53): every SKIP names its host once, in front, put there by the registry, and its reason
(model.Skip) names neither its host nor its own check, so the same reason on many hosts folds into one line.
Driven over every registered node and cluster check with facts that make them skip, and the stages' own SKIPs."""

from __future__ import annotations

import re

import pytest
from test_baseline import another_clusters_report, given, local_report
from test_checks import H800, node_facts

from clustercheck.checks import baseline, collectives, netperf, network, registry
from clustercheck.model import CheckResult, Status
from clustercheck.selection import Selection
from clustercheck.slurm import epilog
from clustercheck.stages import torchjob

TORCH_CUDA = {"version": "2.5.1+cu124", "cuda": "12.4", "cuda_available": True, "device_count": 8, "gloo": True}


def facts_that_skip(name: str) -> list:
    """Nodes on which checks judge nothing: no GPU; GPUs expected that nvidia-smi does not show; an H800 node with
    little else collected; and each of them on a host of another name."""
    return [
        node_facts(name),
        node_facts(name, gpus_expected=8),
        node_facts(name, smi=H800, torch=dict(TORCH_CUDA), cluster_size=1),
    ]


def assert_one_way(result: CheckResult) -> None:
    """RESULT, a SKIP: its host named once, in front; its reason without its host or its own check's name."""
    assert result.status is Status.SKIP and result.skip is not None
    reason = result.skip.reason.replace(result.skip.deselected_by or "\0", "")  # the options may name it: `--skip NAME`
    own_name = re.compile(rf"(?<![\w.]){re.escape(result.name)}(?![\w.])")
    assert not own_name.search(reason), f"{result.name}'s SKIP reason repeats its name: {reason!r}"
    if result.host:
        assert result.host not in reason, f"{result.name}'s SKIP reason names its host: {reason!r}"
        assert result.message.startswith(f"{result.host}: ") and result.message.count(result.host) == 1, result.message


def skips(results: list[CheckResult]) -> list[CheckResult]:
    return [r for r in results if r.status is Status.SKIP]


@pytest.mark.parametrize("check", registry.node_checks(), ids=lambda c: c.name)
def test_a_node_checks_skip_names_its_host_once_and_not_its_own_name(check):
    results = [registry._run_one(check, facts, registry.EVERY) for facts in facts_that_skip("gpu-a7")]
    results.append(registry._run_one(check, node_facts("gpu-a7"), Selection(skip=(check.name,))))
    for result in skips(results):
        assert_one_way(result)
    assert skips(results)  # deselected, at least, it skips


@pytest.mark.parametrize("check", registry.cluster_checks(), ids=lambda c: c.name)
def test_a_cluster_checks_skip_does_not_repeat_its_own_name(check):
    alone = [node_facts("gpu-a7", cluster_size=1)]
    unlike = [node_facts("gpu-a7", cluster_size=2), node_facts("gpu-b2", smi=H800, torch=dict(TORCH_CUDA))]
    results = [check.result(None, check.function(nodes, None)) for nodes in (alone, unlike) if _runs(check, nodes)]
    results += registry.run_cluster_checks(alone, None, Selection(skip=(check.name,)))
    for result in skips(results):
        assert_one_way(result)


def _runs(check, nodes) -> bool:
    """Whether CHECK judges NODES without a configuration (a few read the run's options: those are left out)."""
    try:
        check.function(nodes, None)
    except AttributeError:
        return False
    return True


def test_the_epilogs_skip_of_a_root_job_names_its_node_once():
    """The epilog on node1 after a root job: `node1: job 5 ran as root`, not `node1: node1: job 5 ran as root`."""
    left = epilog.Left(((5120, "sleep"),), 0, 0)
    [processes] = epilog.judge("node1", epilog.Job("5", 0, "root"), left, others=False)
    assert processes.message == "node1: job 5 ran as root"  # contract: the SKIP format, the host once
    assert_one_way(processes)


def test_the_baseline_checks_skip_without_their_host_twice_or_their_own_name():
    """A baseline of other nodes (every figure SKIP, each node's own per node) and of the same node (the figures
    this run did not measure): no `localhost: localhost: ...`, no `baseline.rtt: ...` in a reason."""
    unrelated = baseline.evaluate(given(another_clusters_report()), local_report())
    same = baseline.evaluate(given(local_report()), local_report())
    across = local_report()
    across["hosts"] = ["localhost", "node2"]
    other_nodes = baseline.evaluate(given(across), local_report())
    found = skips(unrelated + same + other_nodes)
    assert {r.host for r in found} >= {None, "localhost"}
    for result in found:
        assert_one_way(result)
    collector = next(r for r in unrelated if r.name == "baseline.collector")
    assert collector.message == "localhost: not compared: no node in common with the baseline"  # contract: as above


def test_the_network_and_collectives_stages_skips_follow_the_rule():
    """The stages' own SKIPs: a measurement not selected, no bandwidth sweep, no probe of the master port."""
    records = {"node1": {"listen": []}, "node2": {"listen": []}}
    found = skips(netperf.perf_checks(records, measure=()))
    found += skips(collectives.evaluate_bandwidth([], 2, hosts=["node1", "node2"]))
    found.append(network.master_port_check(None, "node1", 29500))
    assert {r.name for r in found} >= {"network.rtt", "allreduce.bandwidth.intra_node", "network.master_port"}
    for result in found:
        assert_one_way(result)


def test_a_check_a_failed_job_cut_short_on_a_node_it_does_not_blame_skips_without_its_own_name():
    """node2 froze; node1's check could not run to the end: `node1: did not run to the end: ...`, its reason
    without `allreduce.bandwidth.intra_node`, so node1 and node3's fold into one line."""
    failure = "node node2 stopped making progress (no answer for 30 s)"
    outcome = torchjob.JobOutcome([], 6, "gloo", failure, {"stalled_nodes": ["node2"], "first_failed_node": "node2"})
    cut = [registry.emit("allreduce.bandwidth.intra_node", Status.SKIP, "no ranks", host=h) for h in ("node1", "node3")]
    judged = torchjob.judged(cut, outcome)
    assert [r.status for r in judged] == [Status.SKIP, Status.SKIP] and failure in judged[0].message
    assert judged[0].skip.reason == judged[1].skip.reason
    for result in judged:
        assert_one_way(result)
