#!/usr/bin/env python3
"""A thousand nodes, simulated: the controller's cost of `clustercheck run` at 256, 1,000 and 4,000 nodes, with no
node and no container. Goals for 1,000 nodes: at most 30 s of CPU and 2 GiB, a readable text report, and a cost
that grows no faster than the node pairs do.

    benchmarks/scale_simulation.py                         # 256, 1000 and 4000 nodes
    benchmarks/scale_simulation.py --sizes 256,1000 --json scale.json --reports DIR
    benchmarks/scale_simulation.py --record                # record the node outputs again on this machine

What runs is the pipeline `clustercheck run` runs (run.pipeline.Pipeline through reach.Fanout, the core, network and
collectives stages: the run's torch job of --ranks-per-node ranks, its records benchmarks/scale_ranks.py's; with
--ranks-per-node 0 `--only core --only network`), then every report format (report.FORMAT_NAMES) as `run` delivers
it (report/delivery.py: the run directory's JSON, written as it is rendered, and JUnit; the others to -o FILE). Each
node is a SimTransport (this file: the transport protocol of clustercheck/transport, handed to the pipeline by a
transport factory) that answers every command with the output recorded on a real machine (benchmarks/data/,
provenance in its README): the facts collector's JSON, the clock, the sweeps, the node-local torch job's rank
records and logs. Per node only its name, address and identity (machine ID, boot ID, hostname) are put in, so the
nodes are distinct. The network probe's record is made for each node from the recorded probe records' entries: a
connection entry for every pair and port (every pair, as the probe tries them), a round trip and throughput entry
for each pair of the rounds the probe's own schedule gives (--network-rounds, 8 by default), then printed as the
probe prints it (netprobe.summarise: what was expected counted, the rest listed). One node is slow (its round trips
30 times longer, its transfers 30 times slower) and one pair fails (the second node's connections to the third time
out on both ports, as the recorded firewall probe shows), so the report has findings to list.

Each size runs in a fresh child process, so peaks do not carry over. Measured there: the process's CPU time
(user + system) less the CPU time the simulated nodes spent making their answers (timed in each answering thread),
the wall time of the pipeline and of each report, the peak resident memory (ru_maxrss), and the byte size of each
report. A child whose resident memory passes --max-rss GiB stops itself (the machine is shared). The figures are
one run per size (--rounds N: the median of N).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from clustercheck import report  # noqa: E402
from clustercheck.config import RunConfig  # noqa: E402
from clustercheck.facts import firstcommand  # noqa: E402
from clustercheck.inventory import Node  # noqa: E402
from clustercheck.reach import Fanout  # noqa: E402
from clustercheck.remote import netprobe  # noqa: E402
from clustercheck.report import delivery  # noqa: E402
from clustercheck.run.pipeline import Pipeline  # noqa: E402
from clustercheck.selection import Selection  # noqa: E402
from clustercheck.transport import PUT, CommandResult, SessionQuirks, workdir_for  # noqa: E402
from clustercheck.transport.factory import Connected  # noqa: E402

try:
    from benchmarks import common
    from benchmarks.scale_ranks import RankRecords
except ImportError:  # run as a script: benchmarks/ is on the path
    import common
    from scale_ranks import RankRecords

DATA = Path(__file__).resolve().parent / "data"
CORE_RECORD = DATA / "scale-core-localhost.json"
PROBE_RECORD = DATA / "scale-netprobe-loopback.json"
FIREWALL_RECORD = REPO / "tests" / "unit" / "records" / "netprobe-node3-firewall.json"
SLOWER = 30.0  # the slow node's round trips are this many times longer, its transfers this many times slower
HOST, ADDR = "@@HOST@@", "@@ADDR@@"  # where a node's own name and address go in the recorded facts


def kind(command: list[str]) -> str:
    """What a command the controller sends is, for recording and answering: the same words at both ends."""
    if "torch.distributed.run" in command:  # run as is, or from its directory (`sh -c 'cd "$1" ...' sh DIR ...`)
        return "torchrun"
    if command[:2] == ["sh", "-c"]:
        script = command[2]
        if 'echo "clock=$(date' in script:
            return "first"
        if script == PUT:
            return "put"
        return "sh"
    if len(command) > 2 and command[1].endswith(".pyz"):
        return f"netprobe-{command[3]}" if command[2] == "netprobe" and len(command) > 3 else command[2]
    if command[1:2] == ["-c"] and "rank-*.json" in command[2]:
        return "rank-records"
    if command[1:2] == ["-c"] and "heartbeat" in command[2]:
        return "heartbeats"
    return f"other:{command[0]}"


# --------------------------------------------------------------------------- recording (once, on a real machine)


def record_core() -> None:
    """The core stage on this machine through the real local transport, every command's answer kept by kind."""
    from clustercheck.transport import factory

    answers: dict[str, dict] = {}

    class Recording:
        def __init__(self, transport) -> None:
            self.transport = transport

        def __getattr__(self, name: str):
            return getattr(self.transport, name)

        def run(self, command, **kwargs) -> CommandResult:
            sink, streamed = kwargs.get("on_output"), {"stdout": "", "stderr": ""}
            if sink is not None:  # what is streamed is kept as the recorded output

                def keep(stream: str, text: str) -> None:
                    streamed[stream] += text
                    sink(stream, text)

                kwargs["on_output"] = keep
            result = self.transport.run(command, **kwargs)
            kept = {**vars(result), **streamed} if sink is not None else vars(result)
            what, example = kind(list(command)), list(command)[:3]
            if what == "first":  # its steps, then the facts collector's output: kept as two answers
                first, _, facts = kept["stdout"].partition(firstcommand.FACTS_LINE + "\n")
                answers.setdefault("facts", {**kept, "stdout": facts, "example": example})
                kept = {**kept, "stdout": first}
            answers.setdefault(what, {**kept, "example": example})
            return result

    real = factory.default(None)

    def recording(node, run_id, register) -> Connected:
        connected = real(node, run_id, register)
        connected.transport = Recording(connected.transport)
        return connected

    with tempfile.TemporaryDirectory() as run_dir:
        config = RunConfig(run_dir=Path(run_dir), selection=Selection(only=("core",)))
        node = Node(name="localhost", address="127.0.0.1", connection="local")
        Pipeline([node], config, Fanout(recording)).run()
    CORE_RECORD.write_text(json.dumps({"answers": answers}, indent=1) + "\n")
    say(f"recorded {sorted(answers)} to {CORE_RECORD}")


def record_probe() -> None:
    """Three network probes on loopback addresses, as three nodes, with every pair measured."""
    probe = REPO / "clustercheck" / "remote" / "netprobe.py"
    names = {f"node{i}": f"127.0.0.{i}" for i in (1, 2, 3)}
    with tempfile.TemporaryDirectory() as work:
        go = f"{work}/go"
        peer_file = Path(work) / "peers"
        peer_file.write_text("".join(f"{n} {addr}\n" for n, addr in names.items()))
        args = ["--peers", str(peer_file), "--port", "29500", "--port", "52719", "--perf-port", "53111"]
        args += ["--rounds", "all", "--seed", "0"]

        def barrier(name: str) -> list[str]:
            return ["--ready-file", f"{work}/{name}.ready", "--go-file", go, "--ready-timeout", "30"]

        procs = {
            n: subprocess.Popen(
                [sys.executable, str(probe), "mesh", "--self", n, *args, "--duration", "10", *barrier(n)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for n in names
        }
        ready = subprocess.run(
            [sys.executable, str(probe), "wait-ready", f"{work}/node1.ready", "--timeout", "20"],
            capture_output=True,
            text=True,
        )
        while not all(Path(f"{work}/{n}.ready").exists() for n in names):
            time.sleep(0.05)
        subprocess.run([sys.executable, str(probe), "go", go, "10"], check=True)
        records = {n: json.loads(p.communicate()[0].strip().splitlines()[-1]) for n, p in procs.items()}
    PROBE_RECORD.write_text(json.dumps({"records": records, "wait_ready": ready.stdout}, indent=1) + "\n")
    say(f"recorded the probes of {', '.join(names)} to {PROBE_RECORD}")


# --------------------------------------------------------------------------- the simulated nodes


class Simulation:
    """SIZE simulated nodes: their names, addresses and the recorded answers with each node's own put in."""

    def __init__(self, size: int, ranks: int = 0, pair_rounds: int | None = None) -> None:
        self.size = size
        self.names = [f"node{i:04d}" for i in range(1, size + 1)]
        self.address = {n: f"10.20.{i // 250}.{i % 250 + 1}" for i, n in enumerate(self.names)}
        self.slow = self.names[size // 3]
        # the second node's connections to the third time out; not with a torch job, which a failed pair stops
        self.failing = (self.names[1], self.names[2]) if not ranks else ("", "")
        self.answers = json.loads(CORE_RECORD.read_text())["answers"]
        raw = json.loads(self.answers["facts"]["stdout"].strip().splitlines()[-1])
        recorded_address = self._own_address(raw)
        raw["hostname"] = {"hostname": HOST, "addresses": [ADDR]}
        self.facts = json.dumps(raw).replace(f"{recorded_address}/24", f"{ADDR}/16").replace(recorded_address, ADDR)
        self.interface = next(iter(parse_route_device(raw)), "eth0")
        self.mtu = raw["mtu"].get(self.interface)
        probes = json.loads(PROBE_RECORD.read_text())
        self.probes = probes["records"]
        self.wait_ready = probes["wait_ready"]
        firewall = json.loads(FIREWALL_RECORD.read_text())
        self.timeout_entry = next(o for r in firewall.values() for o in r["outgoing"] if o["result"] == "timeout")
        self.measured = [e for r in self.probes.values() for e in r["perf"] if "rtt_ms" in e]
        self._mesh_parts: dict[tuple, tuple] = {}
        self._listed: tuple[str, tuple[dict, dict]] | None = None  # the node list the probes were sent, read
        self._lock = threading.Lock()
        self.cpu = 0.0  # seconds of CPU the simulated nodes spent making their answers
        self.unknown: dict[str, int] = {}
        local, marker, logs = self.answers["rank-records"]["stdout"].partition("--- clustercheck: logs ---")
        # the run's torch job (its collectives part): RANKS ranks per node, each node's records made at collection
        self.ranks = RankRecords(self.names, ranks, local, marker + logs, self.slow, pair_rounds) if ranks else None

    @staticmethod
    def _own_address(raw: dict) -> str:
        """The recorded machine's address on its default route's interface (what is replaced per node)."""
        route = raw["commands"]["ip_route"]["out"].split()
        return route[route.index("src") + 1]

    def node(self, name: str) -> Node:
        return Node(name=name, address=self.address[name])

    def first(self, name: str) -> str:
        """The recorded first command's answer with the node's own machine ID, boot ID and hostname, and now."""
        i = int(name[4:])
        own = {"clock": f"{time.time():.9f}", "machine_id": f"{i:032x}", "hostname": name}
        own["boot_id"] = f"{i:08x}-0000-4000-8000-{i:012x}"
        lines = []
        for line in self.answers["first"]["stdout"].splitlines():
            key, eq, _ = line.partition("=")
            lines.append(f"{key}={own[key]}" if eq and key in own else line)
        return "\n".join(lines) + "\n"

    def facts_of(self, name: str) -> str:
        return self.facts.replace(HOST, name).replace(ADDR, self.address[name]) + "\n"

    # ------------------------------------------------------------------ the network probe's record

    def mesh(self, args: list[str], listed: str) -> str:
        """The record the probe would print on its node, for the arguments and the node list (its standard input)
        the controller gave it."""
        me = args[args.index("--self") + 1]
        with self._lock:  # every node is sent the same list: read once
            if self._listed is None or self._listed[0] is not listed:
                self._listed = (listed, netprobe.parse_peers(listed))
            named, hostnames = self._listed[1]
        peers = list(named)
        ports = [int(p) for p in _values(args, "--port")]
        rounds = netprobe.parse_rounds(_values(args, "--rounds")[0]) if "--rounds" in args else None
        seed = int(_values(args, "--seed")[0]) if "--seed" in args else None
        measure = tuple(_values(args, "--measure"))
        perf_port = int(_values(args, "--perf-port")[0]) if "--perf-port" in args else None
        outgoing, incoming, resolve, partners = self._parts(tuple(peers), tuple(ports), rounds, seed, hostnames)
        i = peers.index(me)
        out = outgoing[:i] + outgoing[i + 1 :]
        into = incoming[:i] + incoming[i + 1 :]
        src, dst = self.failing
        if me == src:
            j = peers.index(dst) - (peers.index(dst) > i)
            out[j] = [{**self.timeout_entry, "to": dst, "port": p} for p in ports]
        if me == dst:
            j = peers.index(src) - (peers.index(src) > i)
            into[j] = []
        listen = [{"port": p, "ok": True} for p in ports]
        if perf_port and measure:
            listen.append({"port": perf_port, "ok": True, "perf": True})
        recorded = self.probes["node1"]
        record = {
            "node": me,
            "hostname": me,
            "address": self.address[me],
            "interface": self.interface,
            "mtu": self.mtu,
            "listen": listen,
            "outgoing": [entry for entries in out for entry in entries],
            "incoming": [entry for entries in into for entry in entries],
            "resolve": resolve,
            "seconds": recorded["seconds"],
            "barrier": recorded["barrier"],
        }
        if perf_port and measure:
            record["perf"] = self._perf(me, partners.get(me, []), measure)
            record["rounds"] = len(partners["plan"])
        # What the probe prints of what it measured: the same function as on a node.
        return json.dumps(netprobe.summarise(record, {p: self.address[p] for p in peers})) + "\n"

    def _parts(self, peers: tuple, ports: tuple, rounds, seed, hostnames: dict):
        """Each peer's connection entries (out and in) and every resolve entry, made once for every node's record;
        and each node's partners by round from the probe's own schedule."""
        key = (peers, ports, rounds, seed)
        with self._lock:
            if key not in self._mesh_parts:
                ok = next(o for o in self.probes["node1"]["outgoing"] if o["result"] == "ok")
                come = self.probes["node1"]["incoming"][0]
                outgoing = [
                    [{**ok, "to": p, "port": port, "detail": hostnames.get(p, p)} for port in ports] for p in peers
                ]
                incoming = [[{**come, "from": self.address[p], "port": port} for port in ports] for p in peers]
                resolve = {p: {"hostname": hostnames.get(p, p), "addresses": [self.address[p]]} for p in peers}
                plan = netprobe.schedule(list(peers), rounds, seed)
                partners: dict[str, list] = {"plan": plan}
                for number, pairs in enumerate(plan):
                    for a, b in pairs:
                        partners.setdefault(a, []).append((number, b, True))
                        partners.setdefault(b, []).append((number, a, False))
                self._mesh_parts[key] = (outgoing, incoming, resolve, partners)
            return self._mesh_parts[key]

    def _perf(self, me: str, partners: list, measure: tuple[str, ...]) -> list[dict]:
        entries = []
        for number, partner, connects in partners:
            if not connects:
                entries.append({"peer": partner, "round": number, "served": True})
                continue
            base = self.measured[(number + len(me)) % len(self.measured)]
            factor = SLOWER if self.slow in (me, partner) else 1.0
            entry: dict = {"peer": partner, "round": number}
            if "rtt" in measure:
                entry["rtt_ms"] = round(base["rtt_ms"] * factor, 4)
            if "throughput" in measure:
                entry["out_mbps"] = round(base["out_mbps"] / factor, 1)
                entry["in_mbps"] = round(base["in_mbps"] / factor, 1)
            entries.append(entry)
        return entries


def _values(args: list[str], option: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == option]


def parse_route_device(raw: dict) -> list[str]:
    route = raw["commands"]["ip_route"]["out"].split()
    return [route[route.index("dev") + 1]] if "dev" in route else []


class SimTransport:
    """One simulated node: the Transport protocol (clustercheck/transport), answering from the recordings."""

    def __init__(self, sim: Simulation, host: str, run_id: str) -> None:
        self.sim, self.host, self.run_id = sim, host, run_id
        self.workdir = workdir_for(run_id)
        self.quirks = SessionQuirks()
        self.channel = "its SSH connection"

    def run(self, command, *, timeout, env=None, stdin=None, on_output=None) -> CommandResult:
        started = time.thread_time()
        try:
            result = self._answer(list(command), stdin)
            if on_output is not None:
                for stream in ("stdout", "stderr"):
                    if getattr(result, stream):
                        on_output(stream, getattr(result, stream))
                result = CommandResult(result.exit_status, "", "", result.timed_out)
            return result
        finally:
            spent = time.thread_time() - started
            with self.sim._lock:
                self.sim.cpu += spent

    def _answer(self, command: list[str], stdin: str | None) -> CommandResult:
        what = kind(command)
        if what == "first":  # and the facts collector after it, when the command goes on to it (core.COLLECT)
            facts = f"{firstcommand.FACTS_LINE}\n{self.sim.facts_of(self.host)}" if len(command) > 7 else ""
            return CommandResult(0, self.sim.first(self.host) + facts, "")
        if what == "facts":
            return CommandResult(0, self.sim.facts_of(self.host), "")
        if what == "netprobe-mesh":
            return CommandResult(0, self.sim.mesh(command[4:], stdin or ""), "")
        if what == "netprobe-wait-ready":
            return CommandResult(0, self.sim.wait_ready, "")
        if what in ("netprobe-go", "put"):
            return CommandResult(0, "", "")
        if what == "rank-records" and self.sim.ranks is not None and command[-1].endswith("/torch"):
            return CommandResult(0, self.sim.ranks.answer(self.host, self.sim.address[self.host]), "")
        recorded = self.sim.answers.get(what)
        if recorded is None:
            with self.sim._lock:
                self.sim.unknown[what] = self.sim.unknown.get(what, 0) + 1
            return CommandResult(1, "", f"simulated node: no recorded answer for {what}")
        return CommandResult(recorded["exit_status"], recorded["stdout"], recorded["stderr"], recorded["timed_out"])

    def stop(self) -> None:  # nothing runs on a simulated node: nothing to stop, clean up or close
        pass

    cleanup = close = stop


# --------------------------------------------------------------------------- one size, in its own process


def one(size: int, reports_dir: str | None, rounds: int | None, ranks: int, pair_rounds: int | None = None) -> dict:
    sim = Simulation(size, ranks, pair_rounds)
    nodes = [sim.node(n) for n in sim.names]

    def factory(node: Node, run_id: str, register) -> Connected:
        transport = SimTransport(sim, node.name, run_id)
        register(transport)
        return Connected(transport, "simulated")

    with tempfile.TemporaryDirectory(prefix="clustercheck-scale-") as run_dir, tempfile.TemporaryDirectory() as out_dir:
        stages = ("core", "network", "collectives") if ranks else ("core", "network")
        config = RunConfig(
            run_dir=Path(run_dir), selection=Selection(only=stages), network_rounds=rounds, nproc_per_node=ranks or None
        )
        cpu0, wall0 = _cpu(), time.monotonic()
        pipeline = Pipeline(nodes, config, Fanout(factory))
        outcome = pipeline.run()
        cpu1, wall1 = _cpu(), time.monotonic()
        peaks = {"pipeline": _peak_mib()}  # the peak so far after each step: where the peak is reached
        document = report.Report(
            outcome.results, sim.names, pipeline.run_id, time.time(), wall1 - wall0, durations=outcome.durations
        )
        formats = {}
        for fmt in report.FORMAT_NAMES:  # as `run` delivers them: report.json (streamed) and .xml, the others to -o
            c, w = _cpu(), time.monotonic()
            if fmt in delivery.RUN_FILES:
                path = delivery.save(document, Path(run_dir), kinds=(fmt,))[fmt]
            else:
                path = Path(out_dir, f"report.{fmt}")
                delivery.deliver(document, fmt, str(path), say)
            formats[fmt] = {**_lines(path), "cpu_s": round(_cpu() - c, 3), "wall_s": round(time.monotonic() - w, 3)}
            peaks[fmt] = _peak_mib()
            if reports_dir:
                shutil.copyfile(path, Path(reports_dir, f"report-{size}.{fmt}"))
        cpu2 = _cpu()
        run_bytes = sum(f.stat().st_size for f in Path(run_dir).rglob("*") if f.is_file())
    statuses: dict[str, int] = {}
    for r in outcome.results:
        statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
    pairs = size * (size - 1)
    return {
        "nodes": size,
        "ranks_per_node": ranks,
        "fabric_rounds": len(sim.ranks.plan) if sim.ranks and sim.ranks.plan else None,
        "pairs": pairs,
        "pipeline_cpu_s": round(cpu1 - cpu0 - sim.cpu, 3),
        "pipeline_wall_s": round(wall1 - wall0, 3),
        "reports_cpu_s": round(cpu2 - cpu1, 3),
        "controller_cpu_s": round(cpu2 - cpu0 - sim.cpu, 3),
        "simulated_nodes_cpu_s": round(sim.cpu, 3),
        "peak_rss_mib": _peak_mib(),
        "peak_rss_after_mib": peaks,
        "stages_s": {k: round(v, 3) for k, v in outcome.durations.items()},
        "results": len(outcome.results),
        "statuses": statuses,
        "problems": [
            f"{r.status.value} {r.name} {r.host or ''}".strip() for r in outcome.results if r.status.is_problem
        ],
        "reports": formats,
        "run_dir_bytes": run_bytes,
        "unanswered_commands": sim.unknown,
    }


def _lines(path: Path) -> dict:
    """A report file's bytes and lines, as its text counts them (less the file's last newline), read in blocks."""
    with path.open("rb") as f:
        newlines = sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b""))
    return {"bytes": path.stat().st_size - 1, "lines": newlines}


def _peak_mib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


# --------------------------------------------------------------------------- the sizes, one process each


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def measure(sizes: list[int], repeat: int, args) -> list[dict]:
    rows = []
    for size in sizes:
        runs = []
        for _ in range(repeat):
            command = [sys.executable, __file__, "--one", str(size), "--max-rss", str(args.max_rss)]
            command += ["--network-rounds", str(args.network_rounds), "--ranks-per-node", str(args.ranks_per_node)]
            command += ["--pair-rounds", str(args.pair_rounds)] if args.pair_rounds is not None else []
            if args.reports:
                command += ["--reports", args.reports]
            load = os.getloadavg()[0]
            done = subprocess.run(command, capture_output=True, text=True)
            lines = done.stdout.strip().splitlines()
            figures = json.loads(lines[-1]) if lines else {"error": done.stderr.strip()[-500:]}
            figures["load_average"] = [round(load, 2), round(os.getloadavg()[0], 2)]
            say(f"{size} nodes: {json.dumps({k: v for k, v in figures.items() if k != 'problems'})}")
            runs.append(figures)
        ok = [r for r in runs if "error" not in r]
        row = dict(ok[len(ok) // 2] if ok else runs[0])
        if len(ok) > 1:
            for key in ("controller_cpu_s", "pipeline_cpu_s", "reports_cpu_s", "pipeline_wall_s", "peak_rss_mib"):
                row[key] = statistics.median(r[key] for r in ok)
        row["runs"] = runs
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    formats = report.FORMAT_NAMES
    head = ["nodes", "pairs", "CPU s (pipeline + reports)", "wall s", "peak RSS MiB"] + [f"{f} bytes" for f in formats]
    lines = ["| " + " | ".join(head) + " |", "|" + " ---: |" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r.get('nodes', '?')} | | {r['error']} |" + " |" * (len(head) - 3))
            continue
        cells = [
            f"{r['nodes']:,}",
            f"{r['pairs']:,}",
            f"{r['controller_cpu_s']:.1f} ({r['pipeline_cpu_s']:.1f} + {r['reports_cpu_s']:.1f})",
            f"{r['pipeline_wall_s']:.1f}",
            f"{r['peak_rss_mib']:,.0f}",
        ] + [f"{r['reports'][f]['bytes']:,}" for f in formats]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="256,1000,4000", help="node counts (default %(default)s)")
    p.add_argument("--rounds", type=int, default=1, help="runs per size; the median is reported (default 1)")
    p.add_argument("--network-rounds", default="8", help="the run's --network-rounds (default 8; 'all': every pair)")
    p.add_argument(
        "--ranks-per-node", type=int, default=8, help="the torch job's ranks per node (default 8; 0: no torch job)"
    )
    p.add_argument("--pair-rounds", type=int, help="the fabric's pair rounds (default pairs.DEFAULT_ROUNDS; 0: none)")
    p.add_argument("--max-rss", type=float, default=12.0, help="GiB a child may hold before it stops (default 12)")
    p.add_argument("--reports", metavar="DIR", help="also keep every report of every size in DIR")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE")
    p.add_argument("--record", action="store_true", help="record the node outputs again on this machine")
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.record:
        record_core()
        record_probe()
        return 0
    rounds = netprobe.parse_rounds(args.network_rounds)
    if args.one:
        common.rss_guard(args.max_rss)
        print(json.dumps(one(args.one, args.reports, rounds, args.ranks_per_node, args.pair_rounds)))
        return 0
    if args.reports:
        Path(args.reports).mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    info = {
        "nproc": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    rows = measure(sizes, args.rounds, args)
    info["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "sizes": rows}, indent=2) + "\n")
        say(f"benchmark: figures written to {args.json}")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
