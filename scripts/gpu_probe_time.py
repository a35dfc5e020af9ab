#!/usr/bin/env python3
"""What the health program spends per GPU on the controller: parsing `nvidia-smi -q` (read GPU by GPU and joined, as
the collector sends it), `nvidia-smi nvlink -s` and `-e`, and judging every node check, on recorded outputs repeated
for N GPUs (a real output repeated, not an invented one: tests/unit/data/README.md). The node-side time of nvidia-smi
itself is not measured here (it needs a GPU): docs/node-health.md says what is known of it.

    .venv/bin/python scripts/gpu_probe_time.py [GPUS] [REPEATS]
"""

import json
import sys
import time
from pathlib import Path

from clustercheck.checks import registry
from clustercheck.facts import collect, parse
from clustercheck.inventory import Node
from clustercheck.remote import facts as node

TESTS = Path(__file__).resolve().parent.parent / "tests" / "unit"


def best(function, repeats: int) -> float:
    """The best of REPEATS timings of FUNCTION, in seconds."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> int:
    gpus = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    record = json.loads((TESTS / "records" / "facts-h200-vm.json").read_text())
    outputs = {
        "H200 (driver 580, facts-h200-vm.json)": record["commands"]["nvidia_smi_q"]["out"],
        "H800 (driver 525, nvidia-smi-q-h800.txt)": (TESTS / "data" / "nvidia-smi-q-h800.txt").read_text(),
    }
    links = (TESTS / "data" / "nvlink-e-h100-ml-engineering.txt").read_text()
    status = (TESTS / "data" / "nvlink-s-gb200-k8s-test-infra-371.txt").read_text()
    print(f"{gpus} GPUs, best of {repeats}")
    for name, one in outputs.items():
        joined = node.joined_smi_q([one] * gpus)
        raw = json.loads(json.dumps(record))
        raw["commands"]["nvidia_smi_q"]["out"] = joined
        nodes = Node(name="gpu1", address="gpu1")

        def judge(raw=raw, nodes=nodes) -> None:
            registry.run_node_checks(collect.build(nodes, raw, python="p", python_source="s"))

        parse_q = best(lambda joined=joined: parse.parse_nvidia_smi_q(joined), repeats)
        whole = best(judge, repeats)
        print(
            f"{name}: nvidia-smi -q {len(joined) / 1000:.0f} kB, parsed in {parse_q * 1000:.1f} ms "
            f"({parse_q * 1000 / gpus:.2f} ms per GPU); facts built and every node check judged in "
            f"{whole * 1000:.1f} ms"
        )
    nvlink = best(lambda: (parse.parse_nvlink_status(status * gpus), parse.parse_nvlink_errors(links * gpus)), repeats)
    print(
        f"nvlink -s and -e ({len(status) * gpus / 1000:.0f} + {len(links) * gpus / 1000:.0f} kB): "
        f"{nvlink * 1000:.2f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
