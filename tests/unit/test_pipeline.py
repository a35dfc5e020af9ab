"""The orchestration, driven with fake transports and no network: unreachable nodes, refused host keys, Ctrl-C,
a deadline passing, a check that raises, selection before work, and the same test set whether a stage ran.

A fake node answers the commands clustercheck sends with outputs recorded on real machines (records/): the facts
collector's JSON, the network probe's records and the torch workers' rank records.
"""

from __future__ import annotations

import _thread
import base64
import json
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
from fakes import FakeNode, is_put
from harness import probe_records
from wording import says

from clustercheck import reach
from clustercheck.checks import registry
from clustercheck.config import RunConfig
from clustercheck.facts import firstcommand
from clustercheck.inventory import Node
from clustercheck.model import Status
from clustercheck.reach import Fanout
from clustercheck.run.pipeline import Pipeline
from clustercheck.selection import STAGES, Selection
from clustercheck.stages import bundle
from clustercheck.transport import CommandResult, HostKeyError, TransportError
from clustercheck.transport.factory import Connected

RECORDS = Path(__file__).parent / "records"
FIREWALL = probe_records("netprobe-node3-firewall.json")
FACTS = (RECORDS / "facts-debian12-localhost.json").read_text()
NETPROBE = probe_records("netprobe-healthy.json")
COLLECTIVES = json.loads((RECORDS / "collectives-2x2.json").read_text())
DDP = json.loads((RECORDS / "ddp-pass.json").read_text())
NAMES = ("node1", "node2", "node3")
FIRST = json.loads((RECORDS / "first-testcluster.json").read_text())


def is_torch_job(command: list[str]) -> bool:
    """Whether COMMAND starts the run's torch job (stages/shared.py) on a node."""
    return "torch.distributed.run" in command and "stages" in command


def is_first(command: list[str]) -> bool:
    """Whether COMMAND is a node's first command (core.start)."""
    return command[:2] == ["sh", "-c"] and 'echo "clock=$(date' in command[2]


def first_answer(host: str, base: str = "node1", **lines: str) -> str:
    """What the first command printed on node1 of the test cluster (nothing left over, python3), with HOST's
    identity lines (recorded on HOST), LINES put in, and the clock line now (the clocks check compares it)."""
    own = dict(
        line.partition("=")[::2] for line in FIRST[host].splitlines() if line.startswith(("machine_id=", "hostname="))
    )
    out = []
    for line in FIRST[base].splitlines():
        key, eq, value = line.partition("=")
        if eq:
            value = f"{time.time():.9f}" if key == "clock" else lines.pop(key, own.get(key, value))
        out.append(f"{key}{eq}{value}")
    return "\n".join(out) + "\n"


class HealthyNode(FakeNode):
    """A node that answers like a healthy one; BEHAVIOUR(transport, command) may answer first (None: go on). Its
    output is streamed, as every transport does with on_output."""

    def __init__(self, host: str, run_id: str, behaviour=None) -> None:
        super().__init__(host, run_id=run_id, stream="whole")
        self.behaviour = behaviour
        self.parts: list[str] = []  # the parts of the run's torch job it was told to run

    @property
    def index(self) -> int:
        return NAMES.index(self.host)

    def answer(self, command, timeout, stdin) -> CommandResult:
        if self.behaviour is not None:
            answer = self.behaviour(self, command, timeout)
            if answer is not None:
                return self.collecting(command, answer, timeout, stdin) if is_first(command) else answer
        text = " ".join(command)
        if is_put(command):  # a file, as transport.put sends it
            return self.keep(command, stdin)
        if is_first(command):
            return self.collecting(command, CommandResult(0, first_answer(self.host), ""), timeout, stdin)
        if len(command) > 2 and command[2] == "facts":
            return CommandResult(0, FACTS, "")
        if len(command) > 2 and command[2] == "netprobe":
            return CommandResult(0, json.dumps(NETPROBE[self.host]) + "\n", "")
        if "torch.distributed.run" in command:
            if "--parts" in command:  # the run's torch job: the parts it runs
                self.parts = list(json.loads(command[command.index("--parts") + 1]))
            return CommandResult(0, "", "")
        if command[1:2] == ["-c"] and "rank-*.json" in command[2]:
            if command[-1].endswith("/torch"):
                mine = self.torch_job_records()
            else:
                rank = 0 if command[-1].endswith("/local-collectives") else self.index  # a node-local job: rank 0
                mine = [r for r in COLLECTIVES if r["rank"] == rank]
            return CommandResult(0, "".join(json.dumps(r) + "\n" for r in mine), "")
        return CommandResult(1, "", f"fake node: no answer for {text[:80]}")

    def torch_job_records(self) -> list[dict]:
        """This node's rank's records of every part of the run's torch job, as remote/stages.py writes them: each
        part's recorded record of this rank (the node-local part: the recorded node-local job's rank 0, numbered
        as this node's rank in the job), its part named; Lightning does not import here."""
        rank = self.index
        records = {
            "local": {**next(r for r in COLLECTIVES if r["rank"] == 0), "rank": rank, "group_rank": 0},
            "collectives": next(r for r in COLLECTIVES if r["rank"] == rank),
            "ddp": next(r for r in DDP if r["rank"] == rank),
            "lightning": {
                "rank": rank,
                "local_rank": 0,
                "ok": True,
                "import": {"ok": False, "error": "ModuleNotFoundError: No module named 'lightning'"},
                "not_run": "Lightning does not import on every rank",
            },
        }
        return [{**records[part], "part": part} for part in self.parts]

    def collecting(self, command, first: CommandResult, timeout, stdin) -> CommandResult:
        """The first command's answer FIRST, then, when the command goes on to the facts collector (core.COLLECT),
        the bundle kept from standard input and the collector's answer, as the node's shell runs them."""
        if len(command) <= 7 or not first.ok:
            return first
        workdir, digest, args = command[7], command[8], command[9:]
        if digest:
            self.files[bundle.path(workdir)] = base64.b64decode(stdin)
        found = firstcommand.parse_first(first.stdout)
        python = found.python if found.python_runs else "python3"
        facts = self.answer([python, bundle.path(workdir), "facts", *args], timeout, None)
        return CommandResult(
            facts.exit_status,
            f"{first.stdout}{firstcommand.FACTS_LINE}\n{facts.stdout}",
            first.stderr + facts.stderr,
            facts.timed_out,
        )


class Cluster:
    """Three fake nodes; FAULTS maps a node to an exception its connection raises, BEHAVIOUR to its answers."""

    def __init__(self, faults=None, behaviour=None) -> None:
        self.faults = faults or {}
        self.behaviour = behaviour or {}
        self.transports: dict[str, HealthyNode] = {}
        self.nodes = [Node(name=n, address=NETPROBE[n]["address"]) for n in NAMES]

    def factory(self, node: Node, run_id: str, register) -> Connected:
        if node.name in self.faults:
            raise self.faults[node.name]
        transport = HealthyNode(node.name, run_id, self.behaviour.get(node.name))
        self.transports[node.name] = transport
        register(transport)
        return Connected(transport, "fake")

    def run(self, tmp_path: Path, **config):
        config.setdefault("nproc_per_node", 1)  # the recorded rank records: one rank per node
        settings = RunConfig(run_dir=tmp_path, **config)
        return Pipeline(self.nodes, settings, Fanout(self.factory)).run()


def by_key(results) -> dict[tuple[str, str | None], object]:
    return {(r.name, r.host): r for r in results}


def test_a_healthy_fake_cluster_runs_every_stage_and_every_node_is_cleaned_up(tmp_path):
    cluster = Cluster()
    outcome = cluster.run(tmp_path)
    results = by_key(outcome.results)
    assert results[("network.tcp", None)].status is Status.PASS
    assert results[("allreduce", None)].status is Status.PASS
    assert results[("ddp_equivalence", None)].status is Status.PASS, results[("ddp_equivalence", None)].message
    for transport in cluster.transports.values():
        assert transport.cleaned == 1 and transport.closed == 1
        assert len([p for p in transport.files if p.endswith(".pyz")]) == 1  # the node-side package, once


def test_an_unreachable_node_among_reachable_ones_is_named_and_the_others_are_judged(tmp_path):
    cluster = Cluster(faults={"node2": TransportError("node2 (10.0.0.2:22): unreachable: timed out after 3 s")})
    outcome = cluster.run(tmp_path)
    results = by_key(outcome.results)
    connect = results[("connect", "node2")]
    assert connect.status is Status.FAIL and "unreachable" in connect.message and connect.remediation
    assert results[("facts", "node1")].status is Status.PASS and results[("facts", "node3")].status is Status.PASS
    assert ("facts", "node2") not in results
    for name in ("network.tcp", "allreduce", "ddp_equivalence"):
        assert results[(name, None)].status is Status.SKIP and "node2: not reached" in results[(name, None)].message
    assert not outcome.host_key_error
    assert all(t.cleaned for t in cluster.transports.values())


def test_the_next_step_names_the_unreachable_node_first_not_a_finding_on_a_node_reached(tmp_path):
    """The report lists the results node by node: node1's hostname.resolve FAIL (its name resolves to loopback,
    judged for a cluster of three) and its warnings came before node2's connect failure, and the next step named
    them first. What keeps every multi-node stage from running is node2."""
    from clustercheck.report import Report

    cluster = Cluster(faults={"node2": TransportError("node2 (10.0.0.2:22): unreachable: timed out after 3 s")})
    results = cluster.run(tmp_path).results
    node1 = [r for r in results if r.host == "node1"]
    assert any(r.status is Status.FAIL for r in node1) and any(r.status is Status.WARN for r in node1)
    report = Report(results, list(NAMES))
    assert report.next_step.startswith("fix connect on node2 first, then the ")
    assert report.verdict.startswith("NOT READY: ")


def test_a_run_that_reached_no_node_passes_nothing(tmp_path):
    """nodes.distinct said `PASS 0 names, as many machines` when no node answered: nothing was there to judge."""
    from clustercheck.report import Report

    down = {n: TransportError(f"{n} (10.0.0.9:22): unreachable: timed out after 3 s") for n in NAMES}
    results = by_key(Cluster(faults=down).run(tmp_path).results)
    distinct = results[("nodes.distinct", None)]
    assert distinct.status is Status.SKIP and says(distinct.message, "no node reached", "nothing to compare")
    assert says(distinct.skip.reason, "no node reached", "nothing to compare")
    neighbours = results[("neighbour.table", None)]  # not "limits not shown in the nodes' network namespaces"
    assert neighbours.status is Status.SKIP and says(neighbours.message, "no node reached", "nothing to check")
    assert [r for r in results.values() if r.status is Status.PASS] == []
    report = Report(list(results.values()), list(NAMES))
    assert report.verdict == "NOT READY: 3 check(s) failed"  # contract: the verdict line
    assert report.next_step.startswith("fix connect on node1 first, then the 2 other failure(s)")


def test_a_name_that_does_not_resolve_gets_the_dns_fix_not_the_sshd_one(tmp_path):
    """paramiko's connect raises socket.gaierror for a name that does not resolve; the SSH transport wraps it."""
    try:
        socket.getaddrinfo("gpu-02.invalid", 22)  # RFC 6761: .invalid never resolves
    except socket.gaierror as cause:
        failure = TransportError(f"node2 (gpu-02.invalid:22): unreachable: {cause.strerror}")
        failure.__cause__ = cause
        failure.data = {"hostname": "gpu-02.invalid", "port": 22}
    outcome = Cluster(faults={"node2": failure}).run(tmp_path, selection=Selection(only=("core",)))
    connect = by_key(outcome.results)[("connect", "node2")]
    assert connect.status is Status.FAIL
    assert connect.remediation.startswith("gpu-02.invalid does not resolve to an address on this machine")
    assert "sshd" not in connect.remediation
    timed_out = TransportError("node2 (10.0.0.2:22): unreachable: timed out after 3 s")
    other = Cluster(faults={"node2": timed_out}).run(tmp_path / "t", selection=Selection(only=("core",)))
    assert by_key(other.results)[("connect", "node2")].remediation == registry.get("connect").fix


def test_each_stage_that_ran_has_its_duration(tmp_path):
    full = Cluster().run(tmp_path / "full")
    assert {"core", "network", "collectives", "ddp"} <= set(full.durations) <= set(STAGES)
    assert all(seconds >= 0 for seconds in full.durations.values())
    core_only = Cluster().run(tmp_path / "core", selection=Selection(only=("core",)))
    assert list(core_only.durations) == ["core"]


def test_the_firewall_advice_names_the_cluster_network_of_the_inventory(tmp_path):
    def firewalled(transport, command, timeout):
        if len(command) > 2 and command[2] == "netprobe" and "mesh" in command:
            return CommandResult(0, json.dumps(FIREWALL[transport.host]) + "\n", "")
        return None

    cluster = Cluster(behaviour=dict.fromkeys(NAMES, firewalled))
    for node in cluster.nodes:
        node.cluster_cidr = "172.30.82.0/24"
    outcome = cluster.run(tmp_path, selection=Selection(only=("network",), skip=("local.*",)))
    tcp = [r for r in outcome.results if r.name == "network.tcp" and r.status is Status.FAIL]
    assert tcp and all("ufw allow from 172.30.82.0/24" in r.remediation for r in tcp)


def test_a_refused_host_key_runs_nothing_there_and_flags_the_run(tmp_path):
    refused = HostKeyError("node1: HOST KEY CHANGED for 10.0.0.1: refused")
    cluster = Cluster(faults={"node1": refused})
    outcome = cluster.run(tmp_path, selection=Selection(only=("core",)))
    assert outcome.host_key_error
    connect = by_key(outcome.results)[("connect", "node1")]
    assert connect.status is Status.FAIL and connect.data["host_key"] and "HOST KEY CHANGED" in connect.message
    assert "node1" not in cluster.transports


def test_ctrl_c_mid_run_stops_and_cleans_every_node(tmp_path):
    # Python's own SIGINT handler, as clustercheck's command line installs it: a test process started in the
    # background of a script inherits SIGINT ignored, and interrupt_main() then does nothing.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _ctrl_c_mid_run(tmp_path)
    finally:
        signal.signal(signal.SIGINT, previous)


def _ctrl_c_mid_run(tmp_path):
    started = threading.Event()

    def interrupt(transport, command, timeout):
        if len(command) > 2 and command[2] == "facts":
            deadline = time.monotonic() + 10  # every node under way (a node never reached has nothing to clean)
            while time.monotonic() < deadline and sum(bool(t.commands) for t in cluster.transports.values()) < 3:
                time.sleep(0.01)
            started.set()
            _thread.interrupt_main()  # what SIGINT does: KeyboardInterrupt in the main thread
            time.sleep(2)
        return None

    cluster = Cluster(behaviour={"node2": interrupt})
    with pytest.raises(KeyboardInterrupt):
        cluster.run(tmp_path)
    assert started.is_set()
    assert {name: t.cleaned for name, t in cluster.transports.items()} == dict.fromkeys(NAMES, 1)


def test_a_torch_job_past_its_deadline_is_stopped_on_every_node(tmp_path):
    def hang(transport, command, timeout):
        if "torch.distributed.run" in command:
            time.sleep(min(timeout, 5))
            return CommandResult(None, "", "", timed_out=True)
        if "rank-*.json" in " ".join(command):
            return CommandResult(0, "", "")  # the ranks never wrote their records
        return None

    cluster = Cluster(behaviour=dict.fromkeys(NAMES, hang))
    started = time.monotonic()
    outcome = cluster.run(tmp_path, selection=Selection(only=("ddp",), skip=("local.*",)), job_timeout=1)
    assert time.monotonic() - started < 30
    ddp = by_key(outcome.results)[("ddp_equivalence", None)]
    assert ddp.status is Status.FAIL and "timed out after 1 s" in ddp.message
    assert all(t.cleaned for t in cluster.transports.values())


def test_a_check_that_raises_is_an_error_under_its_own_name(tmp_path, monkeypatch):
    def broken(facts):
        raise ZeroDivisionError("division by zero")

    check = registry.Check("test.broken", "core", "node", "nothing", function=broken)
    monkeypatch.setitem(registry.REGISTRY, check.name, check)
    outcome = Cluster().run(tmp_path, selection=Selection(only=("core",), skip=("local.*",)))
    broken_results = [r for r in outcome.results if r.name == "test.broken"]
    assert [(r.host, r.status) for r in broken_results] == [(n, Status.ERROR) for n in NAMES]
    assert "ZeroDivisionError" in broken_results[0].message


def test_deselected_stages_and_checks_do_no_work(tmp_path):
    cluster = Cluster()
    outcome = cluster.run(tmp_path, selection=Selection(skip=("network.*", "local.*")))
    for transport in cluster.transports.values():
        assert not transport.ran("netprobe")  # --skip 'network.*' starts no network probe
        assert not transport.ran("--nnodes=1")  # --skip 'local.*' starts no node-local torch job
    results = by_key(outcome.results)
    assert results[("network.tcp", None)].status is Status.SKIP
    assert "--skip network.*" in results[("network.tcp", None)].message
    assert results[("local.allreduce", "node1")].status is Status.SKIP
    assert results[("ddp_equivalence", None)].status is Status.PASS  # the other stages still ran


def test_the_test_set_is_the_same_whether_a_stage_ran_or_was_skipped(tmp_path):
    ran = Cluster().run(tmp_path / "ran")
    skipped = Cluster().run(tmp_path / "skipped", selection=Selection(only=("core",)))
    assert [(r.name, r.host) for r in ran.results if r.status is not Status.SKIP]  # something really ran
    assert sorted(by_key(ran.results)) == sorted(by_key(skipped.results))
    assert all(name in registry.REGISTRY for name, _ in by_key(ran.results))


def test_a_data_path_that_differs_fails_the_data_stage_and_the_torch_stages_still_run(tmp_path):
    paths = json.loads((RECORDS / "data-paths-node3-differs.json").read_text())  # recorded on node1..node3

    def data_answer(transport, command, timeout):
        if len(command) > 3 and command[2:4] == ["data", "paths"]:
            return CommandResult(0, json.dumps(paths[transport.host]) + "\n", "")
        return None

    cluster = Cluster(behaviour=dict.fromkeys(NAMES, data_answer))
    results = by_key(cluster.run(tmp_path, data_paths=("/srv/ds", "/srv/missing")).results)
    assert results[("data.paths", None)].status is Status.FAIL
    assert "/srv/ds differs on node3" in results[("data.paths", None)].message
    assert results[("data.shared_dir", None)].status is Status.SKIP  # no --shared-dir
    assert results[("ddp_equivalence", None)].status is Status.PASS  # data does not gate the torch stages


def test_the_node_local_collectives_meet_on_a_free_port_of_their_own_not_the_master_port(tmp_path):
    """Where the node-local collectives run as a job of their own (no torch stage follows: --only core), each
    node's ranks meet on a free port of the node's; in a whole run they are a part of the run's one torch job,
    which meets on the master port, and no node-local job runs."""

    def free_port(transport, command, timeout):
        if command[2:4] == ["netprobe", "free-port"]:
            return CommandResult(0, "41234\n", "")
        return None

    alone = Cluster(behaviour={n: free_port for n in NAMES})
    results = by_key(alone.run(tmp_path / "alone", selection=Selection(only=("core",))).results)
    for name, transport in alone.transports.items():
        local = [c for c in transport.commands if "torch.distributed.run" in c]
        assert local and all("--master-port=41234" in c and "local-collectives" in " ".join(c) for c in local)
        assert results[("local.allreduce", name)].status is Status.PASS
    whole = Cluster(behaviour={n: free_port for n in NAMES})
    results = by_key(whole.run(tmp_path / "whole").results)
    for name, transport in whole.transports.items():
        jobs = [c for c in transport.commands if "torch.distributed.run" in c]
        assert len(jobs) == 1 and is_torch_job(jobs[0]) and "--master-port=29500" in jobs[0]
        assert list(json.loads(jobs[0][jobs[0].index("--parts") + 1])) == ["local", "collectives", "ddp", "lightning"]
        assert results[("local.allreduce", name)].status is Status.PASS


def _waits_until_stopped(transport, timeout):
    """A torchrun that waits (for a peer, in the rendezvous) until clustercheck stops it, or its deadline."""
    deadline, stops = time.monotonic() + timeout, transport.stopped
    while transport.stopped == stops and time.monotonic() < deadline:
        time.sleep(0.05)
    return CommandResult(None, "", "", timed_out=transport.stopped == stops)


def test_a_node_whose_ranks_freeze_is_named_within_the_stall_timeout_and_the_job_is_stopped(tmp_path):
    """node2 freezes during the DDP job: its torchrun and its heartbeat poll never answer; the other nodes'
    ranks are alive, waiting at step 3. The job deadline is far away: the watchdog names node2 alone."""
    frozen = threading.Event()

    def node(transport, command, timeout):
        text = " ".join(command)
        if is_torch_job(command):
            return _waits_until_stopped(transport, timeout)
        if "heartbeat" in text:
            if transport.host == "node2":
                frozen.wait(timeout)  # a paused machine: no answer
                return CommandResult(None, "", "", timed_out=True)
            return CommandResult(0, json.dumps({"0": {"step": 3, "phase": "ddp", "age": 0.4}}) + "\n", "")
        return None

    cluster = Cluster(behaviour=dict.fromkeys(NAMES, node))
    started = time.monotonic()
    try:
        outcome = cluster.run(
            tmp_path, selection=Selection(only=("ddp",), skip=("local.*",)), job_timeout=120, stall_timeout=5
        )
    finally:
        frozen.set()
    assert time.monotonic() - started < 30
    ddp = by_key(outcome.results)[("ddp_equivalence", None)]
    assert ddp.status is Status.FAIL
    assert "node node2 stopped making progress before its ranks reported any step" in ddp.message
    assert "its SSH connection does not answer" in ddp.message
    assert "node1" not in ddp.message.split("; the other nodes")[0]
    assert ddp.data["stalled_nodes"] == ["node2"]
    stopped = {name: t.stopped for name, t in cluster.transports.items()}
    assert stopped["node1"] >= 2 and stopped["node3"] >= 2  # after the core stage, and the stall
    assert stopped["node2"] == 1  # not waited for after the stall: it does not answer; the run's cleanup tries it
    assert cluster.transports["node2"].cleaned == 1


def test_a_node_that_freezes_while_its_job_starts_is_named_within_the_stall_timeout(tmp_path):
    """node2 freezes once its torchrun started, before any rank beat: the other nodes' agents wait for it in the
    rendezvous, so no rank beats anywhere; node2 alone stops answering. It is named as soon as it has not
    answered for the stall timeout, not at the job's deadline."""
    frozen, release = threading.Event(), threading.Event()

    def node(transport, command, timeout):
        text = " ".join(command)
        if is_torch_job(command):
            if transport.host == "node2":
                frozen.set()
                release.wait(timeout)
                return CommandResult(None, "", "", timed_out=True)
            return _waits_until_stopped(transport, timeout)
        if "heartbeat" in text:
            if transport.host == "node2" and frozen.is_set():
                release.wait(timeout)  # a paused machine: no answer
                return CommandResult(None, "", "", timed_out=True)
            return CommandResult(0, "{}\n", "")  # answering: no rank beats yet
        return None

    cluster = Cluster(behaviour=dict.fromkeys(NAMES, node))
    started = time.monotonic()
    try:
        outcome = cluster.run(
            tmp_path, selection=Selection(only=("ddp",), skip=("local.*",)), job_timeout=120, stall_timeout=5
        )
    finally:
        release.set()
    assert time.monotonic() - started < 30
    ddp = by_key(outcome.results)[("ddp_equivalence", None)]
    assert ddp.status is Status.FAIL
    assert ddp.message.startswith(
        "ddp_equivalence did not complete: node node2 stopped making progress before its ranks reported any step "
        "(no answer for "
    ), ddp.message
    assert "its SSH connection does not answer; the other nodes (node1, node3) were waiting for it" in ddp.message
    assert ddp.data["stalled_nodes"] == ["node2"]


def test_a_node_answering_but_slow_to_start_is_left_to_the_jobs_deadline(tmp_path):
    """Every node answers, no rank beats (a slow torch import on a busy machine): nobody is blamed before
    --timeout."""

    def node(transport, command, timeout):
        if is_torch_job(command):
            return _waits_until_stopped(transport, timeout)
        if "heartbeat" in " ".join(command):
            return CommandResult(0, "{}\n", "")
        if "rank-*.json" in " ".join(command):
            return CommandResult(0, "", "")  # no rank ever started
        return None

    cluster = Cluster(behaviour=dict.fromkeys(NAMES, node))
    outcome = cluster.run(
        tmp_path, selection=Selection(only=("ddp",), skip=("local.*",)), job_timeout=6, stall_timeout=2
    )
    ddp = by_key(outcome.results)[("ddp_equivalence", None)]
    assert "the torch job timed out after 6 s (--timeout) before its ddp part ended" in ddp.message, ddp.message
    assert "stalled_nodes" not in ddp.data


def test_a_node_that_cannot_start_its_torchrun_for_not_answering_is_named_as_not_answering(tmp_path):
    """node2 froze as the collectives stage began: its torchrun's SSH channel never opens (paramiko gives up after
    the authentication timeout), and its heartbeat poll hangs."""
    release = threading.Event()

    def node(transport, command, timeout):
        text = " ".join(command)
        if transport.host == "node2" and "torch.distributed.run" in command and "collectives" in text:
            time.sleep(1.5)
            return CommandResult(None, "", "could not start the command: Timeout opening channel.")
        if transport.host == "node2" and "heartbeat" in text:
            release.wait(timeout)
            return CommandResult(None, "", "", timed_out=True)
        if "torch.distributed.run" in command and "collectives" in text:
            return _waits_until_stopped(transport, timeout)
        return None

    cluster = Cluster(behaviour=dict.fromkeys(NAMES, node))
    started = time.monotonic()
    try:
        outcome = cluster.run(
            tmp_path, selection=Selection(only=("collectives",), skip=("local.*",)), job_timeout=120, stall_timeout=4
        )
    finally:
        release.set()
    assert time.monotonic() - started < 30
    allreduce = by_key(outcome.results)[("allreduce", None)]
    assert allreduce.message.startswith(
        "allreduce did not complete: torchrun failed on node2 first (no exit status: its SSH connection does not "
        "answer); every node's job was stopped. Last lines from node2: could not start the command: Timeout "
        "opening channel."
    ), allreduce.message
    assert not any("rank-*.json" in " ".join(c) for c in cluster.transports["node2"].commands)  # not asked again


def test_ranks_whose_results_do_not_come_back_are_named_by_their_node(tmp_path):
    """Every torchrun ended well, then node2 froze: its rank records cannot be collected. The report names node2
    and why, not bare rank numbers the user would have to map to nodes."""

    def node(transport, command, timeout):
        if transport.host == "node2" and "rank-*.json" in " ".join(command) and command[-1].endswith("/torch"):
            return CommandResult(None, "", "", timed_out=True)  # no answer within the timeout it was given
        return None

    cluster = Cluster(behaviour=dict.fromkeys(NAMES, node))
    outcome = cluster.run(tmp_path, selection=Selection(only=("ddp",), skip=("local.*",)), stall_timeout=20)
    ddp = by_key(outcome.results)[("ddp_equivalence", None)]
    assert ddp.status is Status.FAIL
    assert says(ddp.message, "ddp_equivalence did not complete", "no result from node2's rank(s) 1")
    assert says(ddp.message, "SSH connection did not answer", "within 20 s")
    assert ddp.data["missing_ranks_by_node"] == {"node2": [1]} and ddp.data["first_failed_node"] == "node2"


def test_a_failed_job_quotes_the_failing_ranks_own_traceback_not_torchruns_report(tmp_path):
    """Recorded torchrun outputs: rank 3 on node2 raised; node1's ranks lost their peer and node1's torchrun ended
    first. The report blames node2 with rank 3's own last traceback lines."""
    data = Path(__file__).parent / "data" / "torchrun"

    def node(transport, command, timeout):
        if is_torch_job(command):
            if transport.host == "node3":
                return _waits_until_stopped(transport, timeout)
            time.sleep(0.2 if transport.host == "node1" else 0.6)
            return CommandResult(1, (data / f"ddp-rank3-raised-{transport.host}.log").read_text(), "")
        return None

    cluster = Cluster(behaviour=dict.fromkeys(NAMES, node))
    outcome = cluster.run(tmp_path, selection=Selection(only=("ddp",), skip=("local.*",)), job_timeout=60)
    ddp = by_key(outcome.results)[("ddp_equivalence", None)]
    assert says(ddp.message, "did not complete", "torchrun failed on node2 first (exit 1)", "rank 3 (local rank 1)")
    assert says(ddp.message, 'torch/optim/optimizer.py", line 530', "out = func(*args, **kwargs)")
    assert says(ddp.message, "RuntimeError: CUDA error: an illegal memory access was encountered", "job was stopped")
    assert ddp.data["first_failed_node"] == "node2" and ddp.data["failed_rank"] == 3


def test_a_torch_job_failing_in_its_ddp_part_keeps_the_parts_before_it_and_names_the_node_in_the_ddp_stage(tmp_path):
    """The run's one torch job: every rank got through the node-local and collectives parts, then node2's torchrun
    failed in the DDP part (its rank's own error in its output), before the first heartbeat poll of the others had
    come back, and every node's job was stopped (none of them taken for silent: their records are asked for). The
    parts every rank completed are judged on their records (PASS); the DDP stage fails naming node2 and its rank's
    error; the stage after it is not run, for the DDP stage's failure."""

    def node(transport, command, timeout):
        if is_torch_job(command):
            transport.parts = list(json.loads(command[command.index("--parts") + 1]))
            if transport.host != "node2":
                return _waits_until_stopped(transport, timeout)
            time.sleep(0.3)  # before the first heartbeat poll: no node has been found silent
            return CommandResult(1, "[default0]:RuntimeError: the DDP part broke on node2\n", "")
        if command[1:2] == ["-c"] and "rank-*.json" in command[2]:
            done = [r for r in transport.torch_job_records() if r["part"] in ("local", "collectives")]
            return CommandResult(0, "".join(json.dumps(r) + "\n" for r in done), "")
        if "heartbeat" in " ".join(command):
            time.sleep(1.0)  # the first poll (5 s in) answers after the other nodes' grace (5 s after the failure)
            return CommandResult(0, "{}\n", "")
        return None

    cluster = Cluster(behaviour=dict.fromkeys(NAMES, node))
    outcome = cluster.run(tmp_path, job_timeout=60)
    results = by_key(outcome.results)
    for name in NAMES:
        assert results[("local.allreduce", name)].status is Status.PASS, results[("local.allreduce", name)].message
    for name in ("allreduce", "allgather", "broadcast"):
        assert results[(name, None)].status is Status.PASS, results[(name, None)].message
    ddp = results[("ddp_equivalence", None)]
    assert ddp.status is Status.FAIL and ddp.data["first_failed_node"] == "node2"
    assert ddp.message.startswith("ddp_equivalence did not complete: torchrun failed on node2 first (exit 1)")
    assert "the DDP part broke on node2" in ddp.message
    lightning = results[("lightning.ddp", None)]
    assert lightning.status is Status.SKIP and "the ddp stage failed" in lightning.message
    assert [p.name for p in (tmp_path / "hosts" / "node1").glob("*.command")] == ["torch.command"]


def test_a_node_that_cannot_be_cleaned_up_is_named_with_the_reason(tmp_path):
    cluster = Cluster()
    original = cluster.factory

    def factory(node, run_id, register):
        connected = original(node, run_id, register)
        if node.name == "node2":

            def cleanup():
                raise TransportError("node2: no answer within 15 s")

            connected.transport.cleanup = cleanup
        return connected

    cluster.factory = factory
    outcome = cluster.run(tmp_path, selection=Selection(only=("network",), skip=("local.*",)))
    assert outcome.unclean == {"node2": "no answer within 15 s"}
    unclean = reach.cleanup_message(outcome.unclean)
    assert says(unclean, "could not stop", "node2", "no answer within 15 s", "at their deadline", "next run stops")
    assert says(reach.cleanup_message({}), "processes", "were stopped") and "could not" not in reach.cleanup_message({})


def _mesh_commands(cluster: Cluster) -> list[list[str]]:
    return [c for t in cluster.transports.values() for c in t.commands if "netprobe" in c and "mesh" in c]


def test_a_skipped_network_measurement_is_not_made_and_reported_skip_as_usual(tmp_path):
    cluster = Cluster()
    outcome = cluster.run(tmp_path, selection=Selection(only=("network",), skip=("network.rtt", "local.*")))
    for command in _mesh_commands(cluster):  # the probe is told to measure throughput only: no RTT round
        assert [command[i + 1] for i, word in enumerate(command) if word == "--measure"] == ["throughput"]
    results = by_key(outcome.results)
    rtt = results[("network.rtt", None)]
    assert rtt.status is Status.SKIP
    assert rtt.message == "network.rtt skipped: not selected (--skip network.rtt)"  # contract: model.skipped_message
    assert results[("network.throughput", None)].status is Status.PASS

    both = Cluster()
    outcome = both.run(tmp_path / "both", selection=Selection(only=("network",), skip=("network.rtt", "network.th*")))
    assert _mesh_commands(both) and not any("--perf-port" in c for c in _mesh_commands(both))  # no perf round
    assert by_key(outcome.results)[("network.throughput", None)].status is Status.SKIP
    assert by_key(outcome.results)[("network.tcp", None)].status is Status.PASS


def test_baseline_checks_appear_only_with_a_baseline_and_compare_this_runs_figures(tmp_path):
    from clustercheck.checks import baseline
    from clustercheck.report import Report
    from clustercheck.report import json as json_report

    first = Cluster().run(tmp_path / "first")
    assert not [r for r in first.results if r.name.startswith("baseline.")] and "baseline" not in first.durations
    document = json_report.document(Report(first.results, ["node1", "node2", "node3"], durations=first.durations))
    for flow in next(c for c in document["checks"] if c["name"] == "network.throughput")["data"]["flows"]:
        if flow["from"] == "node2":
            flow["mbps"] *= 4  # the baseline moved 4 times as much: now is -75 %
    given = baseline.Baseline(document, "first.json", baseline.DEFAULT_TOLERANCES)
    second = Cluster().run(tmp_path / "second", baseline=given)
    results = by_key(second.results)
    throughput = results[("baseline.throughput", None)]
    assert throughput.status is Status.FAIL
    assert throughput.message.startswith("node2 -> node1 throughput") and "(-75 %)" in throughput.message
    assert results[("baseline.rtt", None)].status is Status.PASS
    assert results[("baseline.versions", None)].status is Status.PASS
    assert {results[("baseline.collector", n)].status for n in ("node1", "node2", "node3")} <= {Status.PASS}
    assert "baseline" in second.durations
    network_only = Cluster().run(tmp_path / "network", baseline=given, selection=Selection(only=("network",)))
    assert by_key(network_only.results)[("baseline.throughput", None)].status is Status.FAIL  # --baseline asked
    assert by_key(network_only.results)[("baseline.ddp_step", None)].status is Status.SKIP  # not measured now
    skipped = Cluster().run(tmp_path / "third", baseline=given, selection=Selection(skip=("baseline",)))
    assert {r.status for r in skipped.results if r.name.startswith("baseline.")} == {Status.SKIP}


def test_a_one_node_run_without_master_port_meets_on_a_free_port_of_the_node(tmp_path):
    """Alone, a node has no peer that must agree on the port: without --master-port the run takes a free port of
    the node's (another clustercheck run may hold 29500 there), which the network stage checks and the torch job
    meets on; a port given is kept. (The recorded probe answers for 29500, so only the command is looked at.)"""

    def free_port(transport, command, timeout):
        if command[2:4] == ["netprobe", "free-port"]:
            return CommandResult(0, "41234\n", "")
        return None

    for given, port in ((False, "41234"), (True, "29500")):
        alone = Cluster(behaviour={n: free_port for n in NAMES})
        alone.nodes = alone.nodes[:1]
        alone.run(tmp_path / str(given), master_port_given=given)
        (mesh,) = [c for c in alone.transports["node1"].commands if c[2:4] == ["netprobe", "mesh"]]
        assert mesh[mesh.index("--port") + 1] == port


def test_a_burn_asked_for_on_nodes_without_a_gpu_says_nothing_was_burned_and_is_not_ready(tmp_path):
    """--burn on nodes without GPUs: one line says nothing was burned (not only six gpu.burn.* SKIPs among the
    others), and the verdict is not READY as if the GPUs had been burned; the same for --dcgm-level."""
    from clustercheck.report import Report

    outcome = Cluster().run(tmp_path, burn_seconds=30.0, dcgm_level=2)
    (done,) = [r for r in outcome.results if r.name == "options.done"]
    assert done.status is Status.WARN
    assert "--burn 30s: no GPU on any node, nothing was burned" in done.message
    assert "--dcgm-level 2: no GPU on any node, no DCGM diagnostic ran" in done.message

    def judged(results):  # the fake nodes are this machine, whose hostname resolves to loopback: left out
        return Report([r for r in results if r.name != "hostname.resolve"], list(NAMES)).verdict

    verdict = judged(outcome.results)
    assert verdict.startswith("NOT VERIFIED as asked: --burn 30s: no GPU on any node, nothing was burned")
    assert "READY" not in verdict.split("(otherwise")[0]
    plain = Cluster().run(tmp_path / "plain")
    (none,) = [r for r in plain.results if r.name == "options.done"]
    assert none.status is Status.SKIP and judged(plain.results).startswith("READY")
