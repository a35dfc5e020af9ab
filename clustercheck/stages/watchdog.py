"""The progress watchdog of a torch job (pure logic; torchjob.py polls the nodes and feeds it).

Every rank rewrites a heartbeat file every second with the last step it reached and the CPU time it has used
(remote/common.py). A poll of a node gives, per rank, that step, that time and the heartbeat's age on the node's own
clock, or nothing when the node does not answer. A node is *alive* while some rank's heartbeat is fresh, *answering*
while its polls answer, and *progressing* while its slowest rank's step changes, or, while that rank is still
starting (step 0: importing torch and its libraries, which can take minutes from a shared file system or on a busy
machine), while its ranks work: one of them used at least a twentieth of a CPU since the poll before (a rank that
waits, in a rendezvous or a collective, uses next to none). Three kinds of stall are named:

- a node not alive for the stall timeout while another node is: its ranks are frozen (a paused machine, a
  stopped process, a node that does not answer) and the others wait for it in a collective;
- a node not answering for the stall timeout while another node answers, whatever its ranks were doing: before
  they beat at all (torchrun starting, the rendezvous) the others cannot go on without it either. A node that
  answers but whose ranks have not beaten yet is still starting, and is not blamed for it;
- no node progressing for the stall timeout: a hang; the nodes whose slowest rank is behind the others are named,
  or none when every node waits at the same step.

A job of one node (the core stage's node-local job) has no other node to wait for it or to compare it with: its
stall can only be its own. The node is named when it has not answered for the stall timeout, or when its ranks,
once they reported a step, made no progress for the stall timeout (frozen or hung), saying whether it answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clustercheck.remote.common import is_starting

FRESH = 10.0  # seconds: a heartbeat younger than this shows a live rank (it is rewritten every second)
ANSWERING = 15.0  # seconds: a node whose last poll answered longer ago than this does not answer
PENDING = 8.0  # seconds: nor does a node whose poll under way has waited this long for an answer
WORKING = 0.05  # CPU seconds per second: a starting rank that used this much since the poll before is working


@dataclass
class NodeState:
    alive_at: float  # when a poll last showed a fresh heartbeat (controller clock)
    progress_at: float  # when the node's slowest rank last moved on
    step: int | None = None  # the slowest rank's step (None: no heartbeat seen yet)
    part: int = 0  # its part, in a job of several parts (remote/stages.py): steps count within a part
    phase: str | None = None
    answered_at: float | None = None  # when a poll of the node last answered
    polling_since: float | None = None  # when the poll under way began (None: none under way)
    unanswered: bool = False  # a poll has come back without an answer since the last that answered
    cpu: dict = field(default_factory=dict)  # rank -> the CPU seconds it had used at the last poll that answered
    cpu_at: float | None = None  # when that poll answered

    def where(self) -> str:
        """Where its slowest rank was last seen, in words."""
        where = "before its ranks reported any step" if self.step is None else f"at step {self.step}"
        return where + (f" ({self.phase})" if self.phase else "")

    def answers(self, now: float) -> bool:
        if self.polling_since is not None and now - self.polling_since > PENDING:
            return False
        return self.answered_at is not None and now - self.answered_at <= ANSWERING

    def silent(self, now: float) -> bool:
        """Known not to answer: a poll under way for longer than PENDING, a poll come back without an answer, or
        the last answer older than ANSWERING. A node no poll has had the time to reach yet is not: a job that
        fails in its first seconds stops it like every other node, and its records are asked for."""
        if self.polling_since is not None and now - self.polling_since > PENDING:
            return True
        if self.answered_at is None:
            return self.unanswered
        return self.unanswered or now - self.answered_at > ANSWERING


@dataclass(frozen=True)
class Stall:
    nodes: tuple[str, ...]  # the nodes named (empty: a hang no single node explains)
    message: str
    data: dict = field(default_factory=dict)


class Watchdog:
    def __init__(self, nodes: dict[str, str], stall_timeout: float, now: float) -> None:
        """NODES: each node's name -> how it is reached, in words (its transport's channel)."""
        self.stall_timeout = stall_timeout
        self.started = now
        self.nodes = {n: NodeState(alive_at=now, progress_at=now) for n in nodes}
        self.channels = dict(nodes)

    def silent_for(self, node: str, now: float) -> float:
        """How long NODE has not answered at NOW (0 while it answers); a node never heard from counts from the
        start."""
        state = self.nodes[node]
        if state.answers(now):
            return 0.0
        return now - (self.started if state.answered_at is None else state.answered_at)

    def polling(self, node: str, now: float) -> None:
        """A poll of NODE begins at NOW."""
        self.nodes[node].polling_since = now

    def observe(self, node: str, ranks: dict[str, dict] | None, now: float) -> None:
        """A poll of NODE at NOW: rank -> {"step", "phase", "age"}, or None when the node did not answer."""
        state = self.nodes[node]
        state.polling_since = None
        state.unanswered = ranks is None
        if ranks is not None:
            state.answered_at = now
        if not ranks:
            return
        ages = [r.get("age", FRESH) for r in ranks.values()]
        if min(ages) < FRESH:
            state.alive_at = max(state.alive_at, now - min(ages))
        # The slowest of the ranks still beating: one whose heartbeat stopped (it finished, or froze) moves no more, and
        # must not hide a rank that works on (rank 0 waiting for a local reference run after the others ended).
        beating = {rank: r for rank, r in ranks.items() if r.get("age", FRESH) < FRESH} or ranks
        slowest = min(beating.values(), key=lambda r: (r.get("part", 0), r.get("step", 0), r.get("phase") or ""))
        working = self._working(state, ranks, now)
        seen = (slowest.get("part", 0), slowest.get("step"), slowest.get("phase"))
        if seen != (state.part, state.step, state.phase):
            state.part, state.step, state.phase = seen
            state.progress_at = now
        elif is_starting(state.phase) and working:
            state.progress_at = now

    @staticmethod
    def _working(state: NodeState, ranks: dict[str, dict], now: float) -> bool:
        """Whether one of RANKS used at least WORKING CPU seconds per second since STATE's poll before; STATE then
        keeps this poll's figures."""
        cpu = {rank: r["cpu"] for rank, r in ranks.items() if isinstance(r.get("cpu"), (int, float))}
        before, before_at = state.cpu, state.cpu_at
        state.cpu, state.cpu_at = cpu, now
        if before_at is None or now <= before_at:
            return False
        return any(used - before[rank] >= WORKING * (now - before_at) for rank, used in cpu.items() if rank in before)

    def ended(self, node: str, now: float) -> None:
        """NODE's job ended: it waits for nobody and nobody waits for it."""
        state = self.nodes[node]
        state.alive_at = state.progress_at = state.answered_at = now

    def stall(self, now: float) -> Stall | None:
        """The stall to report at NOW, or None while the job makes progress (or every node is silent alike)."""
        if len(self.nodes) == 1:
            return self.alone(now)
        named = self.stopped(now)
        if named:
            texts = [self._stopped_text(name, now) for name in named]
            others = [n for n in self.nodes if n not in named]
            return Stall(
                tuple(named),
                "; ".join(texts) + f"; the other nodes ({', '.join(others)}) were waiting for it",
                self._data(named, now),
            )
        return self.hang(now)

    def stopped(self, now: float) -> list[str]:
        """The nodes that stopped at NOW: frozen (no fresh heartbeat for the stall timeout) while another node is
        alive, or silent (no answer for the stall timeout) while another node answers."""
        limit = self.stall_timeout
        frozen = {n for n, s in self.nodes.items() if now - s.alive_at > limit}  # no fresh heartbeat
        silent = {n for n in self.nodes if self.silent_for(n, now) > limit}  # no answer at all
        alive = [n for n in self.nodes if n not in frozen]
        answering = [n for n in self.nodes if self.nodes[n].answers(now)]
        return sorted((frozen if alive else set()) | (silent if answering else set()))

    def _stopped_text(self, name: str, now: float) -> str:
        s = self.nodes[name]
        where = s.where()
        if now - s.alive_at > self.stall_timeout and s.step is not None:
            seen = f"last seen {now - s.alive_at:.0f} s ago"
        elif self.silent_for(name, now) > self.stall_timeout:
            seen = f"no answer for {self.silent_for(name, now):.0f} s"
        else:  # it answers, yet its ranks never beat while the other nodes' ranks do
            seen = f"no heartbeat in {now - s.alive_at:.0f} s"
        answers = "answers" if s.answers(now) else "does not answer"
        return f"node {name} stopped making progress {where} ({seen}); {self.channels[name]} {answers}"

    def alone(self, now: float) -> Stall | None:
        """The stall of a job's only node at NOW: no answer for the stall timeout, or, once its ranks reported a
        step, no progress for the stall timeout (a frozen node's ranks stop moving on first)."""
        ((name, s),) = self.nodes.items()
        limit = self.stall_timeout
        silent = self.silent_for(name, now) > limit
        if not silent and (s.step is None or now - s.progress_at <= limit):
            return None
        where = s.where()
        if s.step is not None and now - s.alive_at > FRESH:
            seen = f"last seen {now - s.alive_at:.0f} s ago"
        elif silent:
            seen = f"no answer for {self.silent_for(name, now):.0f} s"
        else:  # its ranks beat, and wait
            seen = f"no progress for {now - s.progress_at:.0f} s"
        answers = "answers" if s.answers(now) else "does not answer"
        message = f"node {name} stopped making progress {where} ({seen}); {self.channels[name]} {answers}"
        return Stall((name,), message, self._data([name], now))

    def hang(self, now: float) -> Stall | None:
        """No node progressing for the stall timeout, once a rank reported a step: the nodes behind the others are
        named, or none when every node waits at the same step."""
        limit = self.stall_timeout
        if all(now - s.progress_at > limit for s in self.nodes.values()) and any(
            s.step is not None for s in self.nodes.values()
        ):
            # (part, step): a later part is ahead of any step of an earlier one; (0, -1): no step yet
            steps = {n: (0, -1) if s.step is None else (s.part, s.step) for n, s in self.nodes.items()}
            lowest = min(steps.values())
            behind = sorted(n for n, step in steps.items() if step == lowest)
            if len(behind) < len(self.nodes):
                where = "before its ranks reported any step" if lowest[1] < 0 else f"at step {lowest[1]}"
                return Stall(
                    tuple(behind),
                    f"no node made progress for {limit:.0f} s: {', '.join(f'node {n}' for n in behind)} stopped "
                    f"{where} while the others reached a later step and wait for it",
                    self._data(behind, now),
                )
            return Stall(
                (),
                f"no node made progress for {limit:.0f} s: every node waits at step {lowest[1]} "
                f"({self.nodes[behind[0]].phase or 'unknown phase'}), a hang no single node explains",
                self._data([], now),
            )
        return None

    def _data(self, named: list[str], now: float) -> dict:
        return {
            "stalled_nodes": list(named),
            "progress": {
                n: {
                    "part": s.part,
                    "step": s.step,
                    "phase": s.phase,
                    "last_seen_s": round(now - s.alive_at, 1),
                    "ssh_answers": s.answers(now),
                    "ssh_silent_s": round(self.silent_for(n, now), 1),
                }
                for n, s in self.nodes.items()
            },
        }
