"""Verify the local machine as a one-node cluster: torch imports, and collectives are correct across ranks."""

from __future__ import annotations

import json
import os
import socket
import sys
from importlib import resources
from pathlib import Path

from clustercheck import collectives
from clustercheck.model import CheckResult, Status
from clustercheck.transport import LocalTransport

PROBE = (
    "import json, torch; print(json.dumps({'torch': torch.__version__, 'cuda': torch.cuda.is_available(), "
    "'gpus': torch.cuda.device_count()}))"
)


def probe_torch(transport: LocalTransport, python: str, host: str) -> tuple[CheckResult, dict | None]:
    result = transport.run([python, "-c", PROBE], timeout=120)
    if result.ok:
        try:
            facts = json.loads(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            facts = None
        if facts:
            return CheckResult(
                "torch.import",
                Status.PASS,
                f"{host}: torch {facts['torch']} imports with {python}",
                host=host,
                data=facts,
            ), facts
    last = (result.stderr.strip().splitlines() or ["timed out" if result.timed_out else "no output"])[-1]
    return CheckResult(
        "torch.import",
        Status.FAIL,
        f"{host}: torch does not import with {python}: {last}",
        host=host,
        remediation=f"Install PyTorch for {python} (pip install torch), or pass "
        "--python with the environment that has it.",
        data={"python": python},
    ), None


def run_local(python: str, run_dir: Path, nproc: int | None, timeout: float, port: int) -> list[CheckResult]:
    host = socket.gethostname()
    transport = LocalTransport(host)
    torch_check, facts = probe_torch(transport, python, host)
    results = [torch_check]
    if facts is None:
        return results + [
            CheckResult(name, Status.SKIP, f"{name} skipped: torch does not import", host=None)
            for name in collectives.COLLECTIVES
        ]
    use_gpus = facts["cuda"] and facts["gpus"] > 0
    backend = "nccl" if use_gpus else "gloo"
    nproc = nproc or (facts["gpus"] if use_gpus else 2)
    worker = run_dir / "worker" / "collectives.py"
    worker.parent.mkdir(parents=True, exist_ok=True)
    worker.write_text(resources.files("clustercheck.worker").joinpath("collectives.py").read_text())
    out_dir = run_dir / "ranks"
    command = [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--node-rank=0",
        f"--nproc-per-node={nproc}",
        "--master-addr=127.0.0.1",
        f"--master-port={port}",
        str(worker),
        "--out",
        str(out_dir),
        "--backend",
        backend,
    ]
    # One node: the ranks talk over loopback whatever the hostname resolves to.
    env = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "1"}
    launched = transport.run(command, timeout=timeout, env=env)
    (run_dir / "torchrun.log").write_text(launched.stdout + launched.stderr)
    records = []
    for rank_file in sorted(out_dir.glob("rank-*.json")) if out_dir.exists() else []:
        records.append(json.loads(rank_file.read_text()))
    if launched.timed_out and not records:
        tail = " ".join((launched.stderr or "").strip().splitlines()[-1:])
        records = [{"rank": 0, "host": host, "ok": False, "error": f"torchrun timed out after {timeout:.0f}s {tail}"}]
    elif not records:
        tail = " ".join((launched.stderr or "").strip().splitlines()[-1:])
        records = [{"rank": 0, "host": host, "ok": False, "error": f"torchrun exited {launched.exit_status}: {tail}"}]
    return results + collectives.evaluate(records, nproc)


def default_python() -> str:
    """The environment python the setup recorded, else the python running clustercheck."""
    recorded = Path("/etc/clustercheck/python")
    if recorded.exists() and os.access(recorded.read_text().strip(), os.X_OK):
        return recorded.read_text().strip()
    return sys.executable
