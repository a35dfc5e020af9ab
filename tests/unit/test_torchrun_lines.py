"""Per-node torchrun command lines and environments for a static-rendezvous multi-node job."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from importlib import resources

import pytest

from clustercheck.stages import bundle, launch, torchjob


def node(name, address, gpus=0, python="/opt/venv/bin/python"):
    return launch.NodeSpec(name, address, gpus, python, f"/tmp/cc-run/{name}")


def test_cpu_nodes_get_gloo_two_ranks_each_and_the_first_node_as_master():
    nodes = [node("node1", "10.0.0.11"), node("node2", "10.0.0.12"), node("node3", "10.0.0.13")]
    plans = launch.plan(
        nodes, worker="ddp", stage="ddp", master_port=29500, interface="eth0", worker_args=["--steps", "5"]
    )
    assert [p.node_rank for p in plans] == [0, 1, 2]
    assert launch.world_size(plans) == 6
    second = plans[1]
    assert second.command == [
        *("sh", "-c", launch.IN_RUN_DIR, "sh", "/tmp/cc-run/node2"),  # in the run directory: none of the user's files
        "/opt/venv/bin/python",
        "-m",
        "torch.distributed.run",
        "--nnodes=3",
        "--nproc-per-node=2",
        "--node-rank=1",
        "--master-addr=10.0.0.11",
        "--master-port=29500",
        "--max-restarts=0",
        "--redirects=3",
        "--log-dir=/tmp/cc-run/node2/ddp/torchrun-logs",
        "--tee=3",
        "/tmp/cc-run/node2/clustercheck-remote.pyz",
        "ddp",
        "--out",
        "/tmp/cc-run/node2/ddp",
        "--backend",
        "gloo",
        "--steps",
        "5",
    ]
    assert second.env["GLOO_SOCKET_IFNAME"] == "eth0" and second.env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert second.env["NCCL_DEBUG"] == "INFO"
    assert second.env["NCCL_DEBUG_FILE"].startswith("/tmp/cc-run/node2/")


def test_gpu_nodes_get_nccl_one_rank_per_gpu():
    plans = launch.plan(
        [node("a", "10.0.0.1", gpus=8), node("b", "10.0.0.2", gpus=4)],
        worker="collectives",
        stage="collectives",
        master_port=29400,
        interface="ens5",
    )
    assert [p.nproc for p in plans] == [8, 4]
    assert "--backend" in plans[0].command and plans[0].command[plans[0].command.index("--backend") + 1] == "nccl"
    assert plans[0].env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert plans[0].env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"


def test_one_node_without_gpus_makes_everyone_use_gloo():
    assert launch.choose_backend([8, 0, 8]) == "gloo"
    assert launch.choose_backend([8, 8]) == "nccl"
    assert launch.choose_backend([]) == "gloo"


def test_ranks_per_node_override_and_interface_left_to_torch():
    plans = launch.plan(
        [node("a", "10.0.0.1")], worker="ddp", stage="ddp", master_port=29500, interface=None, nproc_override=3
    )
    assert plans[0].nproc == 3
    assert "GLOO_SOCKET_IFNAME" not in plans[0].env


def test_extra_env_reaches_only_its_node():
    plans = launch.plan(
        [node("a", "10.0.0.1"), node("b", "10.0.0.2")],
        worker="ddp",
        stage="ddp",
        master_port=29500,
        interface="eth0",
        extra_env={"b": {"NCCL_IB_HCA": "mlx5_0"}},
    )
    assert "NCCL_IB_HCA" not in plans[0].env
    assert plans[1].env["NCCL_IB_HCA"] == "mlx5_0"


def test_shell_line_quotes_everything():
    plan = launch.plan(
        [node("a", "10.0.0.1", python="/opt/my env/python")], worker="ddp", stage="ddp", master_port=1, interface="eth0"
    )[0]
    line = plan.shell()
    assert line.startswith("env GLOO_SOCKET_IFNAME=eth0 ")
    assert "'/opt/my env/python' -m torch.distributed.run" in line


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"master_port": 70000}, "not a TCP port"),
        ({"nproc_override": 0}, "at least 1"),
    ],
)
def test_impossible_launches_are_clear_errors(kwargs, message):
    args = {"worker": "ddp", "stage": "ddp", "master_port": 29500, "interface": "eth0", **kwargs}
    with pytest.raises(launch.LaunchError, match=message):
        launch.plan([node("a", "10.0.0.1")], **args)


def test_more_nccl_ranks_than_gpus_is_an_error():
    with pytest.raises(launch.LaunchError, match="but it has 2 GPU"):
        launch.plan(
            [node("a", "10.0.0.1", gpus=2)], worker="ddp", stage="ddp", master_port=1, interface=None, nproc_override=4
        )


def test_no_nodes_is_an_error():
    with pytest.raises(launch.LaunchError, match="no nodes"):
        launch.plan([], worker="ddp", stage="ddp", master_port=1, interface=None)


def test_collected_records_come_back_and_truncated_ones_are_left_out(tmp_path):
    out = tmp_path / "ddp"
    out.mkdir()
    (out / "rank-0.json").write_text(json.dumps({"rank": 0, "ok": True}))
    (out / "rank-1.json").write_text('{"rank": 1, "ok"')  # killed while writing
    command = launch.collect_command(sys.executable, str(tmp_path), "ddp")
    stdout = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    assert launch.parse_collected(stdout)[0] == [{"rank": 0, "ok": True}]


def test_the_same_command_brings_back_the_stage_s_logs(tmp_path):
    """Rank records, heartbeats, torchrun's per-rank logs and the run's NCCL logs, in one archive on the collect
    command's output; links and other stages' files are left on the node."""
    out = tmp_path / "ddp"
    (out / "torchrun-logs" / "none_x" / "attempt_0" / "0").mkdir(parents=True)
    (out / "heartbeat").mkdir()
    (out / "rank-0.json").write_text(json.dumps({"rank": 0, "ok": True}))
    (out / "torchrun-logs" / "none_x" / "attempt_0" / "0" / "stderr.log").write_text("Traceback: boom\n")
    (out / "torchrun-logs" / "none_x" / "attempt_0" / "0" / "stdout.log").write_text("")
    (out / "heartbeat" / "rank-0.json").write_text('{"step": 3}')
    (out / "secret").symlink_to("/etc/hostname")
    (tmp_path / "nccl-node1-42.log").write_text("node1:42:42 [0] NCCL INFO Bootstrap : Using eth0\n")
    (tmp_path / "facts.json").write_text("{}")  # another stage's file: not this stage's
    command = launch.collect_command(sys.executable, str(tmp_path), "ddp")
    stdout = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    records, archive = launch.parse_collected(stdout)
    assert records == [{"rank": 0, "ok": True}]
    target = tmp_path / "controller" / "hosts" / "node1"
    torchjob.keep_files(archive, target)
    kept = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert kept == [
        "ddp/heartbeat/rank-0.json",
        "ddp/rank-0.json",
        "ddp/torchrun-logs/none_x/attempt_0/0/stderr.log",
        "ddp/torchrun-logs/none_x/attempt_0/0/stdout.log",
        "nccl-node1-42.log",
    ]
    assert (target / "ddp/torchrun-logs/none_x/attempt_0/0/stderr.log").read_text() == "Traceback: boom\n"
    # Output cut short inside the archive's line (not whole base64) keeps the records, and gives no archive.
    cut = stdout[: stdout.index(launch.LOGS_LINE) + len(launch.LOGS_LINE) + 20]
    assert launch.parse_collected(cut) == (records, None)


def test_the_node_side_package_stays_runnable_on_python_38():
    # Nodes run it with their own python: Ubuntu 20.04 ships 3.8.
    sources = [e for e in resources.files("clustercheck.remote").iterdir() if e.name.endswith(".py")]
    assert {e.name.removesuffix(".py") for e in sources} >= set(bundle.PROGRAMS)
    for entry in sources:
        source = entry.read_text()
        ast.parse(source, feature_version=(3, 8))
        if "annotations" in source or "->" in source:
            assert "from __future__ import annotations" in source, entry.name


def test_the_bundle_runs_its_programs_from_one_file(tmp_path):
    pyz = bundle.write(tmp_path)
    proc = subprocess.run([sys.executable, pyz, "netprobe", "free-port"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert 0 < int(proc.stdout) < 65536
    assert subprocess.run([sys.executable, pyz], capture_output=True, text=True).returncode != 0


def test_torchs_compile_cache_is_in_the_run_directory_not_tmpdir():
    """torch makes $TMPDIR/torchinductor_<user> in every job that imports its optimizers; a torch stage's goes in
    the run's work directory on the node, removed with it."""
    (plan,) = launch.plan([node("node1", "10.0.0.11")], worker="ddp", stage="ddp", master_port=29500, interface=None)
    assert plan.env["TORCHINDUCTOR_CACHE_DIR"] == "/tmp/cc-run/node1/torchinductor"
