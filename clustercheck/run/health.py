"""`clustercheck node-health`: the core stage's per-node checks on this machine, the way a scheduler's health
program runs (Slurm's HealthCheckProgram: as root, without the user's environment, killed after 60 s).

The facts come from the same collector the run uploads to every node (stages/core.py), run here through the local
transport with the environment's python found the same way; the checks are the registry's per-node checks. Every
probe has its own deadline and the collector one over all of them, so a hung nvidia-smi costs PROBE_DEADLINE; no
step gets more than what is left of BUDGET, so the whole program, scontrol included, ends before Slurm's 60 s.
Nothing runs across nodes, no torch job.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from clustercheck import expected, slurm
from clustercheck.checks import registry
from clustercheck.facts import collect
from clustercheck.inventory import Node
from clustercheck.model import CheckResult, Status
from clustercheck.report import Report
from clustercheck.stages import core
from clustercheck.transport.local import LocalTransport

PROBE_DEADLINE = 10.0  # each probe command of the collector (nvidia-smi, chronyc, journalctl, ...)
TORCH_DEADLINE = 20.0  # torch's import, in its own process beside the probes
PYTHON_DEADLINE = 5.0  # the environment's python to start (the first command, core.start)
COLLECTOR_DEADLINE = 25.0  # the collector as a whole: everything it started is killed then
SCONTROL_DEADLINE = 6.0  # each scontrol command (show, then update)
BUDGET = 50.0  # the whole program, under Slurm's 60 s: no step gets more than what is left of it
SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
TEXTFILE = "clustercheck_node_health.prom"
TORCH_MAX_AGE = 3600.0  # default: torch's import is run again at least hourly, and whenever what it depends on changes
KEPT_IMPORT = "node-health-import.json"  # the kept import, in kept_import_dir()
CLUSTER_MEMBER = 2  # the cluster size the checks are told: more than one node (see judge)


@dataclass(frozen=True)
class Health:
    """What one node-health run found on this node."""

    report: Report

    @property
    def failed(self) -> bool:
        return self.report.status is Status.FAIL


def system_path(path: str | None) -> str:
    """PATH with the system's directories added where missing: slurmd runs its health program with no PATH,
    and the probes (ufw, nft, iptables in /usr/sbin) and scontrol must be found all the same."""
    given = [p for p in (path or "").split(os.pathsep) if p]
    return os.pathsep.join(given + [p for p in SYSTEM_PATH if p not in given])


def node_name(environ: dict[str, str] | os._Environ) -> str:
    """The node's name in Slurm: SLURMD_NODENAME (slurmd sets it for its health program), else the short
    hostname (Slurm's NodeName is the short name unless the configuration says otherwise)."""
    return environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


class Budget:
    """What is left of BUDGET seconds from its start: a step's deadline is its own, or what is left if less."""

    def __init__(self, seconds: float = BUDGET) -> None:
        self.until = time.monotonic() + seconds

    def give(self, deadline: float) -> float:
        return max(1.0, min(deadline, self.until - time.monotonic()))


def kept_import_dir() -> Path:
    """Where node-health keeps torch's last successful import: /var/cache/clustercheck for root (slurmd's health
    program), the user's cache directory otherwise."""
    if os.geteuid() == 0:
        return Path("/var/cache/clustercheck")
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "clustercheck"


def check(
    name: str,
    budget: Budget,
    models: expected.Catalog | None = None,
    *,
    torch_max_age: float = TORCH_MAX_AGE,
    kept: Path | None = None,
) -> Health:
    """Collect this machine's facts and run every per-node check on them, as node NAME, against the expected
    values MODELS (default: the shipped ones). torch's last successful import, kept in the directory KEPT
    (default: kept_import_dir()), is reused while younger than TORCH_MAX_AGE seconds and while nothing it depends
    on changed (the collector's import_fingerprint); 0 imports torch every run."""
    started_at, started = time.time(), time.monotonic()
    node = Node(name=name, address="localhost", connection="local")
    transport = LocalTransport(host=name)
    reuse: list[str] = []
    if torch_max_age > 0:
        directory = kept or kept_import_dir()
        try:
            directory.mkdir(mode=0o755, parents=True, exist_ok=True)
            reuse = ["--reuse-import", str(directory / KEPT_IMPORT), str(torch_max_age)]
        except OSError:
            pass  # nowhere to keep it: torch is imported every run
    try:
        results = _check(node, transport, budget, models, reuse)
    finally:
        transport.cleanup()  # whatever a probe left past its deadline (a hung nvidia-smi's children) is killed
    report = Report(results, [name], transport.run_id, started_at, time.monotonic() - started)
    return Health(report)


def _check(
    node: Node, transport: LocalTransport, budget: Budget, models: expected.Catalog | None, reuse: list[str]
) -> list[CheckResult]:
    # The collector imports torch with the environment's python; when that does not start, python3 collects
    # without torch (core.start), and the reused import does not apply.
    args = [str(TORCH_DEADLINE), "--probe-timeout", str(PROBE_DEADLINE), *reuse]
    first, deadline = budget.give(PYTHON_DEADLINE), budget.give(COLLECTOR_DEADLINE)
    begun = core.start(node, transport, None, timeout=first, collect=args, collect_timeout=deadline)
    python, source, missing = begun.python, begun.source, begun.missing
    facts_check = registry.get("facts")
    collected = begun.collected
    if collected is None or collected.raw is None:
        cause = begun.facts_problem(deadline)
        finding = registry.Finding(Status.ERROR, f"could not collect facts with {python}: {cause}")
        return [facts_check.result(node.name, finding)]
    raw, took = collected.raw, collected.seconds
    results = [facts_check.result(node.name, registry.passed(f"facts collected with {python} in {took:.1f} s"))]
    return results + judge(node, raw, python=python, source=source, missing=missing, models=models)


def judge(
    node: Node,
    raw: dict,
    *,
    python: str,
    source: str,
    missing: str | None = None,
    models: expected.Catalog | None = None,
) -> list[CheckResult]:
    """Every per-node check on the collector's output RAW, as node-health judges its node (pure), against the
    expected values MODELS (default: the shipped ones)."""
    # No inventory says how many GPUs to expect here: the NVIDIA GPUs on the PCI bus do, so a GPU node whose
    # nvidia-smi hangs or fails is a FAIL (gpu.count), not a node without GPUs.
    on_bus = len(((raw.get("gpu_bridges") or {}).get("gpus")) or {})
    node = replace(node, gpus_expected=on_bus or node.gpus_expected)
    # A node a health program watches is one of a cluster's: what matters only across nodes (a stopped time
    # service, a hostname that resolves to loopback) is judged as it is in a run over several nodes.
    facts = collect.build(
        node, raw, python=python, python_source=source, python_missing=missing, cluster_size=CLUSTER_MEMBER
    )
    if models is not None:
        facts.models = models
    return registry.run_node_checks(facts)


def slurm_update(health: Health, name: str, say: Callable[[str], None], budget: Budget) -> None:
    """Drain node NAME in Slurm on a FAIL, resume it when healthy and drained by us; say what was done, or why
    nothing could be (scontrol missing or failing), in one line each. Never raises."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        say("scontrol not found: the node's state in Slurm was not read or changed")
        return
    shown = _run([scontrol, "show", "node", name], budget.give(SCONTROL_DEADLINE))
    if shown.returncode != 0:
        say(f"scontrol show node {name} failed ({_why(shown)}): the node's state in Slurm was left as it is")
        return
    try:
        state = slurm.parse_show_node(shown.stdout, name)
    except slurm.ParseError as exc:
        say(f"scontrol show node {name}: {exc}: the node's state in Slurm was left as it is")
        return
    action = slurm.decide(state, health.report.results)
    if action is None:
        if state.drained and not state.ours and health.failed:
            say(f"{name} is already drained in Slurm ({state.reason or 'no reason'}): its reason was kept")
        elif state.drained and not state.ours:
            say(f"{name} stays drained in Slurm: drained by someone else ({state.reason or 'no reason'})")
        return
    done = _run(action.argv(scontrol), budget.give(SCONTROL_DEADLINE))
    if done.returncode != 0:
        say(f"scontrol update nodename={name} state={action.state} failed ({_why(done)})")
        return
    say(action.describe())


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"no answer within {timeout:.0f} s")
    except OSError as exc:
        return subprocess.CompletedProcess(argv, 126, "", str(exc))


def _why(proc: subprocess.CompletedProcess) -> str:
    last = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or [""])[-1]
    return f"exit {proc.returncode}" + (f": {last}" if last else "")
