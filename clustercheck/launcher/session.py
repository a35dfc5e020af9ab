"""`clustercheck launch` from start to end: the preflight, reaching every node, the code (compared or --sync),
the torchrun line per node, then the job in the foreground or under systemd units (--detach), and every node
cleaned up. Each step is a module of its own; a Launch holds what the steps hand each other.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from clustercheck.facts.model import NodeFacts
from clustercheck.inventory import Node
from clustercheck.launcher import background, codesync, connect, foreground, preflight, spares
from clustercheck.launcher import command as cmd
from clustercheck.launcher.job import Echo, Finished, LaunchOptions, NotStarted
from clustercheck.model import CheckResult
from clustercheck.reach import Reach
from clustercheck.stages import Member, core
from clustercheck.stages.launch import NodeLaunch, NodeSpec
from clustercheck.transport import Transport, new_run_id

# The preflight's choice and results, with spares; what it returns, when not None, reaches the nodes from then on
# (the Slurm job shrunk: its steps with the job's new variables).
LeaveOut = Callable[[spares.Choice, list[CheckResult]], Reach | None]


class Launch:
    """One launch across NODES, in inventory order."""

    def __init__(
        self,
        nodes: list[Node],
        options: LaunchOptions,
        reach: Reach,
        echo: Echo,
        say: Echo,
        leave_out: LeaveOut | None = None,
    ) -> None:
        self.nodes = nodes
        self.options = options
        self.reach = reach  # how commands reach the nodes
        self.echo = echo  # the job's own output
        self.say = say  # clustercheck's progress and verdict
        self.leave_out = leave_out  # with spares: what becomes of the nodes the preflight left out
        self.job_id = new_run_id()
        self.transports: dict[str, Transport] = {}
        self.members: list[Member] = []
        self.plans: list[NodeLaunch] = []
        self.homes: dict[str, str] = {}
        self.preflight_facts: dict[str, NodeFacts] = {}  # what the preflight collected, not collected again
        self.cwd: str | None = None
        self.running = codesync.RunningRecords(
            reach
        )  # where the job is recorded as running from the compared directory
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ before the job

    def preflight(self) -> None:
        """The core and network stages through the pipeline; any FAIL or ERROR refuses the launch. With spares
        (--spare K): a node with a problem of its own is left out instead, and the job runs on the first of the
        healthy ones; those left out are handed to LEAVE_OUT (drained, given back to Slurm) first, and too few
        healthy nodes refuse the launch."""
        if not self.options.spare:
            self.preflight_facts = preflight.run(self.nodes, self.options, self.reach, self.say)
            return
        wanted = len(self.nodes) - self.options.spare
        facts, choice, results = preflight.vet(self.nodes, self.options, self.reach, self.say, wanted)
        if self.leave_out is not None:
            self.reach = self.leave_out(choice, results) or self.reach
        if not choice.enough:
            raise NotStarted(f"preflight: {choice.refusal()}")
        self.nodes = [n for n in self.nodes if n.name in choice.kept]
        self.preflight_facts = {name: f for name, f in facts.items() if name in choice.kept}

    def connect(self) -> None:
        """Connect to every node, find its environment python and its cluster address."""

        def register(node: Node, transport: Transport) -> None:
            with self._lock:
                self.transports[node.name] = transport

        facts, self.homes = connect.node_facts(
            self.nodes, self.options, self.reach, self.job_id, self.preflight_facts, register
        )
        self.members = core.members(self.nodes, self.transports, facts)

    def prepare(self) -> tuple[str, str | None, str | None]:
        """The script path and working directory on the nodes, and the code archive on the nodes (--sync), after
        checking that every node has the same code. Returns (script, cwd, archive path)."""
        o = self.options
        if o.sync is not None:
            return codesync.upload(self.reach, self.members, o.sync, o, self.say)
        if o.command.is_module:
            self.say("the script is a module (-m): its code is not compared between nodes")
            return o.command.script, o.chdir, None
        self.running.trees = codesync.compare(self.reach, self.members, o, self.say)
        return o.command.script, o.chdir, None

    def plan(self, script: str, cwd: str | None) -> list[NodeLaunch]:
        o = self.options
        specs = [
            NodeSpec(
                m.name,
                m.address,
                m.gpus,
                m.facts.torch_python,
                m.transport.workdir.rstrip("/"),
                o.container,
            )
            for m in self.members
        ]
        # The job's own directory on each node: a detached job's outlives the launch (its logs stay there).
        job_dirs = {
            m.name: f"{self.homes[m.name]}/.local/state/clustercheck/jobs/{self.job_id}"
            if o.detach
            else m.transport.workdir.rstrip("/")
            for m in self.members
        }
        self.plans = cmd.plan(
            specs,
            o.command,
            job_id=self.job_id,
            master_port=o.master_port,
            # With rails, the job's sockets use them all (gloo round-robin over the list, NCCL one socket per rail).
            interfaces={m.name: ",".join(m.node.rail_interfaces) or m.interface for m in self.members},
            log_dirs={name: f"{directory}/ranks" for name, directory in job_dirs.items()},
            job_dirs=job_dirs,
            nproc_override=o.nproc_per_node,
            env=o.env,
            script=script,
        )
        for p in self.plans:
            host_dir = o.run_dir / "hosts" / p.node.name
            host_dir.mkdir(parents=True, exist_ok=True)
            (host_dir / "launch.command").write_text(p.shell() + "\n")
        self.cwd = cwd
        return self.plans

    # ------------------------------------------------------------------ the job

    def run_foreground(self) -> Finished:
        """torchrun on every node, output streamed; when one node's torchrun fails, every node is stopped."""
        self.running.start(self.members, self.job_id, in_unit=False)
        o = self.options
        return foreground.run(
            self.plans,
            self.members,
            o.command,
            self.reach,
            run_dir=o.run_dir,
            cwd=self.cwd,
            master_port=o.master_port,
            echo=self.echo,
            say=self.say,
        )

    def start_detached(self, code: str | None) -> list[str]:
        """The job's unit on every node; when one node cannot start it, the others are stopped again."""
        self.running.start(self.members, self.job_id, in_unit=True)
        try:
            return background.start(self.reach, self.plans, self.members, self.job_id, self.cwd, code)
        except NotStarted:
            self.running.end(self.job_id)  # nothing runs from the directory any more
            raise

    # ------------------------------------------------------------------ ending

    def stop_all(self) -> None:
        """Kill every process this launch started, on every node (the run-marker sweep)."""
        self.reach.stop(list(self.transports.values()))

    def close(self) -> None:
        """Every node cleaned up: this launch's processes killed, its work directory removed, disconnected."""
        if not self.options.detach:  # a foreground job ends with its launch; a detached one's end is on the node
            self.running.end(self.job_id)
        self.reach.finish(list(self.transports.values()))
