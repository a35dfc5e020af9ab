"""Collectives across the GPUs (or CPU ranks) of one node: torchrun --nnodes=1 on the node itself.

The worker (worker/collectives.py) is copied into the run's work directory on
the node and started with the node's environment python; the per-rank
records come back into the local run directory and are judged by
clustercheck.collectives. Multi-node collectives are a separate check.
"""

from __future__ import annotations

import json
import os
import tempfile
from importlib import resources
from pathlib import Path

from clustercheck import collectives
from clustercheck.model import CheckResult, Status
from clustercheck.transport import Transport, TransportError

NAMES = tuple(f"local.{name}" for name in collectives.COLLECTIVES)


def skipped(host: str, why: str) -> list[CheckResult]:
    return [CheckResult(name, Status.SKIP, f"{host}: {name} skipped: {why}", host=host) for name in NAMES]


def run(
    transport: Transport,
    python: str,
    gpus: int,
    local_dir: Path,
    *,
    nproc: int | None,
    timeout: float,
    port: int,
) -> list[CheckResult]:
    host = transport.host
    backend = "nccl" if gpus > 0 else "gloo"
    nproc = nproc or (gpus if gpus > 0 else 2)
    remote_worker = f"{transport.workdir}/collectives.py"
    remote_out = f"{transport.workdir}/ranks"
    with tempfile.TemporaryDirectory() as tmp:
        worker = Path(tmp) / "collectives.py"
        worker.write_text(resources.files("clustercheck.worker").joinpath("collectives.py").read_text())
        transport.put(str(worker), remote_worker)
    command = [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--node-rank=0",
        f"--nproc-per-node={nproc}",
        "--master-addr=127.0.0.1",
        f"--master-port={port}",
        remote_worker,
        "--out",
        remote_out,
        "--backend",
        backend,
    ]
    # One node: the ranks talk over loopback whatever the hostname resolves to.
    env = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "1"}
    launched = transport.run(command, timeout=timeout, env=env)
    (local_dir / "torchrun.log").write_text(launched.stdout + launched.stderr)
    ranks_dir = local_dir / "ranks"
    ranks_dir.mkdir(parents=True, exist_ok=True)
    records = []
    for rank in range(nproc):
        target = ranks_dir / f"rank-{rank}.json"
        try:
            transport.get(f"{remote_out}/rank-{rank}.json", str(target))
            records.append(json.loads(target.read_text()))
        except (TransportError, OSError, ValueError):
            if target.exists():
                os.unlink(target)
    if not records:
        tail = launched.cause()
        if launched.timed_out:
            tail = f"torchrun timed out after {timeout:.0f} s"
        records = [{"rank": 0, "host": host, "ok": False, "error": f"torchrun: {tail}"}]
    results = collectives.evaluate(records, nproc)
    for r in results:
        r.name = f"local.{r.name}"
        r.host = host
        r.message = f"{host}: {r.message}"
    return results
