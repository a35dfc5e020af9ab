"""Run a worker as a real multi-node torchrun job whose "nodes" are separate torchrun agents on this machine.

Each agent gets the command and environment that clustercheck.stages.launch builds for a node, its own run
directory with the node-side bundle in it, and talks to the others over loopback, exactly as nodes talk over the
cluster network. A fault for one "node" is Python source run at its interpreters' start (a sitecustomize on its
PYTHONPATH), as a broken library on one real node would be.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from clustercheck.stages import bundle, launch


@dataclass
class JobResult:
    launches: list[launch.NodeLaunch]
    records: list[dict]
    exit_codes: list[int | None]
    logs: list[str]

    @property
    def world_size(self) -> int:
        return launch.world_size(self.launches)


def run_job(
    tmp_path: Path,
    worker: str,
    *,
    nnodes: int,
    nproc: int,
    master_port: int,
    worker_args: list[str] | None = None,
    extra_env: dict[str, dict[str, str]] | None = None,
    faults: dict[str, str] | None = None,
    timeout: float = 240,
) -> JobResult:
    nodes = [
        launch.NodeSpec(
            name=f"node{i + 1}",
            address="127.0.0.1",
            gpus=0,
            python=sys.executable,
            run_dir=str(tmp_path / f"node{i + 1}"),
        )
        for i in range(nnodes)
    ]
    plans = launch.plan(
        nodes,
        worker=worker,
        stage=worker,
        master_port=master_port,
        interface="lo",
        worker_args=worker_args,
        nproc_override=nproc,
        extra_env=extra_env,
    )
    procs = []
    for plan in plans:
        bundle.write(plan.node.run_dir)
        log = open(Path(plan.node.run_dir) / "torchrun.log", "w")  # noqa: SIM115 - closed below
        env = dict(os.environ)
        if plan.node.name in (faults or {}):
            fault_dir = Path(plan.node.run_dir) / "fault"
            fault_dir.mkdir()
            (fault_dir / "sitecustomize.py").write_text(faults[plan.node.name])
            env["PYTHONPATH"] = str(fault_dir)
        procs.append(
            (
                subprocess.Popen(
                    plan.command, env={**env, **plan.env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                ),
                log,
            )
        )
    deadline = time.monotonic() + timeout
    codes: list[int | None] = []
    for proc, log in procs:
        try:
            codes.append(proc.wait(timeout=max(deadline - time.monotonic(), 1)))
        except subprocess.TimeoutExpired:
            codes.append(None)
        log.close()
    for proc, _ in procs:  # leave nothing running, whatever happened
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    records = []
    for plan in plans:
        out = Path(launch.output_dir(plan.node.run_dir, worker))
        parts = sorted(p for p in out.glob("*/rank-*.json") if p.parent.name != "heartbeat")  # a job of parts
        records += [json.loads(p.read_text()) for p in [*sorted(out.glob("rank-*.json")), *parts]]
    logs = [(Path(p.node.run_dir) / "torchrun.log").read_text() for p in plans]
    return JobResult(plans, sorted(records, key=lambda r: (r["rank"], r.get("part", ""))), codes, logs)
