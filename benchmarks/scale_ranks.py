"""The run's torch job at scale, for benchmarks/scale_simulation.py: what every simulated node hands back when the
controller collects the job's rank records (launch.collect_command), made from rank records recorded on a real
machine, each rank's own rank, node and place put in.

Per node and local rank, two records, as remote/stages.py writes them for the parts `local` (the node-local
collectives: the core stage's local.* checks) and `collectives` (the collectives over every rank, the all_reduce
sweep, the sweep inside the node, and the fabric pair rounds where the worker has them):

- `local`: the node-local job's record recorded with the core stage (benchmarks/data/scale-core-localhost.json,
  `rank-records`), its world the node's ranks.
- `collectives`: rank 0's record of tests/unit/records/collectives-2x2.json (two torchrun agents of two gloo ranks,
  provenance in tests/unit/records/README.md), its world the job's, its intra-node sweep the node's ranks, its
  endpoints the node-local record's (3 per rank: a gloo rank over N nodes holds a connection per peer rank, which a
  job of 8 ranks per node at 4,000 nodes would not run over gloo; NCCL's ranks record no endpoints).
- `fabric` (when clustercheck/remote/pairs.py is there: the pair rounds' schedule): each rank's figures by round
  and partner, as remote/collectives.py records them. The seconds are the recorded sweep's time for its largest
  message (4 MiB) scaled to the pair's bytes; the slow node's every rail (and one node's rail 1) SLOWER times
  slower, so the judgement has a node and a rail to name. The rounds are pairs.schedule's (DEFAULT_ROUNDS); the
  confirm round is left empty (no confirm schedule).
"""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COLLECTIVES_RECORD = REPO / "tests" / "unit" / "records" / "collectives-2x2.json"
SLOWER = 30.0
PAIR_BYTES = 1 << 22  # the pair rounds' message size in the simulation (the recorded sweep's largest)
PAIR_ITERS = 5
SEED = 54

try:  # the pair rounds' schedule (issue 54): the fabric figures are simulated once it is there
    from clustercheck.remote import pairs
except ImportError:  # pragma: no cover - before it lands
    pairs = None


class RankRecords:
    """Every node's collect answer for a job of NAMES (in node_groups order), RANKS ranks per node."""

    def __init__(self, names: list[str], ranks: int, local_records: str, logs: str, slow: str, rounds=None) -> None:
        self.names, self.ranks = names, ranks
        self.pair_rounds = pairs.DEFAULT_ROUNDS if rounds is None and pairs is not None else rounds
        self.index = {n: i for i, n in enumerate(names)}
        local = [json.loads(line) for line in local_records.splitlines() if line.startswith("{")]
        self.local = local[0]
        self.logs = logs  # the recorded answer's logs line and archive, as they came
        self.collectives = json.loads(COLLECTIVES_RECORD.read_text())[0]
        largest = self.collectives["bandwidth"]["world"][-1]
        self.pair_seconds = largest["time_us"] / 1e6 * PAIR_BYTES / largest["bytes"]
        self.slow = self.index[slow]
        self.slow_rail = (self.index[names[2 * len(names) // 3]], 1 % ranks)  # one node's rail 1 slow
        self.plan = self._plan()
        self.rounds_s = 0.0

    def _plan(self) -> list[list[tuple[int, int]]] | None:
        if pairs is None or len(self.names) < 2 or not self.pair_rounds:
            return None  # no pair rounds: the records carry no fabric key, fabric.* SKIP
        return pairs.schedule(len(self.names), SEED, self.pair_rounds)

    def answer(self, name: str, address: str) -> str:
        """NAME's collect answer: its ranks' records of both parts, a line each, then the recorded logs."""
        i = self.index[name]
        first = i * self.ranks
        node_ranks = list(range(first, first + self.ranks))
        partners = self._partners(i)
        lines = []
        for local_rank, rank in enumerate(node_ranks):
            own = {"rank": rank, "local_rank": local_rank, "host": name}
            endpoints = [
                {**e, "local": address, "remote": address if e["remote"] != "0.0.0.0" else e["remote"]}
                for e in self.local.get("endpoints", [])
            ]
            lines.append(
                json.dumps({**self.local, **own, "part": "local", "world_size": self.ranks, "group_rank": local_rank})
            )
            bandwidth = dict(self.collectives["bandwidth"])
            intra = bandwidth.get("intra_node")
            if intra is not None:
                bandwidth["intra_node"] = {**intra, "node_index": i, "ranks": node_ranks}
            record = {
                **self.collectives,
                **own,
                "part": "collectives",
                "world_size": len(self.names) * self.ranks,
                "bandwidth": bandwidth,
                "endpoints": endpoints,
            }
            if partners is not None:
                record["fabric"] = self._fabric(i, local_rank, partners)
            lines.append(json.dumps(record))
        return "\n".join(lines) + "\n" + self.logs

    def _partners(self, i: int) -> list[int | None] | None:
        """Node I's partner in every round of the plan (None: it sits the round out)."""
        if self.plan is None:
            return None
        if not hasattr(self, "_partner_by_round"):
            self._partner_by_round = [{**dict(r), **{b: a for a, b in r}} for r in self.plan]
        return [partner.get(i) for partner in self._partner_by_round]

    def _fabric(self, i: int, rail: int, partners: list[int | None]) -> dict:
        """Rank (node I, RAIL)'s fabric record as remote/fabricpairs.py writes it: the seconds each round's bytes
        took to arrive from the partner (None: no partner that round), the schedule on rank 0. No confirm round."""

        def seconds(partner: int | None) -> float | None:
            if partner is None:
                return None
            slow = self.slow in (i, partner) or self.slow_rail in ((i, rail), (partner, rail))
            return round(self.pair_seconds * (SLOWER if slow else 1.0), 6)

        record = {
            "node": i,
            "rail": rail,
            "interface": None,
            "bytes": PAIR_BYTES,
            "iters": PAIR_ITERS,
            "seed": SEED,
            "recv": [seconds(partner) for partner in partners],
            "confirm": [],
        }
        if i == 0 and rail == 0:
            record["schedule"] = self.plan
            record["confirm_schedule"] = []
        return record
