"""`clustercheck launch`'s pure parts: the user's torchrun command line, the per-node plans, the node/rank prefixes,
the same-code comparison (the node-side hashing program run here on real directories) and the detached jobs'
listing."""

from __future__ import annotations

import dataclasses
import io
import os
import subprocess
import sys
import tarfile
import time

import pytest
from wording import says

from clustercheck.launcher import command, detached, output, sameness
from clustercheck.stages import launch
from clustercheck.stages.launch import LaunchError, NodeSpec, launch_fix


def nodes(count=3, gpus=0):
    return [
        NodeSpec(f"node{i}", f"10.0.0.1{i}", gpus, "/opt/venv/bin/python", f"/tmp/clustercheck-j/{i}")
        for i in range(1, count + 1)
    ]


def plan(user_argv, count=3, gpus=0, **kw):
    specs = nodes(count, gpus)
    return command.plan(
        specs,
        command.parse(user_argv),
        job_id="0123456789ab",
        master_port=kw.pop("master_port", 29500),
        interfaces={n.name: "eth0" for n in specs},
        log_dirs={n.name: f"/tmp/clustercheck-j/ranks-{n.name}" for n in specs},
        **kw,
    )


def test_static_launch_gives_every_node_its_rank_in_inventory_order_and_the_first_node_as_master():
    plans = plan(["train.py", "--epochs", "3"])
    assert [p.node_rank for p in plans] == [0, 1, 2]
    assert plans[1].command == [
        "/opt/venv/bin/python",
        "-m",
        "torch.distributed.run",
        "--nnodes=3",
        "--nproc-per-node=2",
        "--node-rank=1",
        "--master-addr=10.0.0.11",
        "--master-port=29500",
        "--log-dir=/tmp/clustercheck-j/ranks-node2",
        "--tee=3",
        "train.py",
        "--epochs",
        "3",
    ]
    assert plans[1].env == {"PYTHONUNBUFFERED": "1", "NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"}
    assert command.first_ranks(plans, elastic=False) == {"node1": 0, "node2": 2, "node3": 4}


@pytest.mark.parametrize("gpus", [0, 4])
def test_a_launch_runs_as_many_ranks_per_node_as_the_run_does(gpus):
    """The same default as `clustercheck run`'s torch jobs: without GPUs 2 CPU ranks per node, with GPUs one per
    GPU (the quick start's launch ran 1 rank where its run had used 2)."""
    ran = launch.plan(nodes(2, gpus), worker="ddp", stage="ddp", master_port=29500, interface="eth0")
    launched = plan(["train.py"], count=2, gpus=gpus)
    assert [p.nproc for p in launched] == [p.nproc for p in ran] == [gpus or launch.CPU_RANKS_PER_NODE] * 2


def test_gpu_nodes_get_one_rank_per_gpu_and_nccl_settings_and_the_users_env_wins():
    plans = plan(["train.py"], count=2, gpus=4, env={"NCCL_SOCKET_IFNAME": "ib0", "WANDB_MODE": "offline"})
    assert "--nproc-per-node=4" in plans[0].command
    assert plans[0].env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert plans[0].env["NCCL_SOCKET_IFNAME"] == "ib0" and plans[0].env["WANDB_MODE"] == "offline"
    assert command.first_ranks(plans, elastic=False) == {"node1": 0, "node2": 4}
    with pytest.raises(LaunchError, match="node1: 8 ranks per node asked for, but it has 4 GPU") as refused:
        plan(["train.py"], count=2, gpus=4, nproc_override=8)
    # What the torch stages give as the fix (seen on an H200 VM asked for 2 ranks on its one GPU).
    assert "at most 4 rank(s) per node (--nproc-per-node)" in launch_fix(refused.value)
    assert launch_fix(OSError("no route")) is None  # the check's own fix


def test_elastic_options_pass_through_and_the_first_node_is_the_rendezvous_endpoint():
    user = ["--nnodes", "2:4", "--max_restarts=3", "--rdzv-backend", "c10d", "train.py", "--lr", "0.1"]
    plans = plan(user)
    cmd = plans[2].command
    assert "--nnodes=2:4" in cmd and "--max-restarts=3" in cmd and "--rdzv-backend=c10d" in cmd
    assert "--rdzv-endpoint=10.0.0.11:29500" in cmd and "--rdzv-id=0123456789ab" in cmd
    assert not any(a.startswith(("--node-rank", "--master-addr")) for a in cmd)
    assert cmd.count("--nnodes=2:4") == 1 and "--nnodes=3" not in cmd
    assert cmd[-3:] == ["train.py", "--lr", "0.1"]
    assert command.first_ranks(plans, elastic=True) == {"node1": None, "node2": None, "node3": None}
    # A node range alone means c10d rendezvous; the user's own endpoint and id are kept.
    cmd = plan(["--nnodes=1:3", "--rdzv-endpoint=head:1234", "--rdzv-id=x", "t.py"])[0].command
    assert "--rdzv-backend=c10d" in cmd and "--rdzv-endpoint=head:1234" in cmd and "--rdzv-id=x" in cmd


def test_module_and_script_arguments_that_look_like_options_belong_to_the_script():
    user = command.parse(["-m", "trainer.main", "--config", "a.yaml"])
    assert user.is_module and user.script == "trainer.main" and user.args == ("--config", "a.yaml")
    cmd = plan(["-m", "trainer.main"])[0].command
    assert "--module" in cmd and cmd[-1] == "trainer.main"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "no script to launch"),
        (["--max-restarts"], "--max-restarts: needs a value"),
        (["--node-rank=1", "t.py"], "--node-rank=1: not allowed after -- .clustercheck sets it"),
        (["--master-port", "1", "t.py"], "use clustercheck launch --master-port"),
        (["--nproc_per_node=2", "t.py"], "use clustercheck launch --nproc-per-node"),
        (["--standalone", "t.py"], "--standalone: not allowed"),
        (["--tee", "3", "t.py"], "streamed with a node/rank prefix"),
        (["--bogus", "t.py"], "--bogus: not a torchrun option"),
        (["--module=x", "t.py"], "takes no value"),
    ],
)
def test_bad_torchrun_command_lines_are_one_line_errors(argv, message):
    with pytest.raises(LaunchError, match=message):
        command.parse(argv)


@pytest.mark.parametrize(
    ("nnodes", "count", "answer"),
    [(None, 3, "3"), ("3", 3, "3"), ("2:4", 3, "2:4"), ("3:3", 3, "3:3")],
)
def test_nnodes_admits_the_inventory(nnodes, count, answer):
    argv = (["--nnodes", nnodes] if nnodes else []) + ["t.py"]
    assert command.check_nnodes(command.parse(argv), count) == answer


@pytest.mark.parametrize(
    ("nnodes", "message"),
    [("2", "the inventory has 3 node.s.; use MIN:MAX"), ("4:8", "outside 4..8"), ("x", "expected N or MIN:MAX")],
)
def test_nnodes_that_cannot_hold_the_inventory_is_refused(nnodes, message):
    with pytest.raises(LaunchError, match=message):
        command.check_nnodes(command.parse(["--nnodes", nnodes, "t.py"]), 3)


def test_env_pairs():
    assert command.parse_env(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}
    for bad in ("A", "=1", "1A=2", "A B=1"):
        with pytest.raises(LaunchError, match="expected NAME=VALUE"):
            command.parse_env([bad])


# ---------------------------------------------------------------------------------------- output


def test_torchrun_tee_marks_become_node_and_global_rank_prefixes():
    # What torchrun 2.13's --tee=3 printed for a 2-rank node (captured with tests' torch on this machine).
    out = output.NodeOutput("node2", first_rank=2)
    lines = out.feed("stdout", "[default0]:hello from 0\n[default1]:hel")
    assert lines == ["node2/2: hello from 0"]  # contract: the rank's line after its node/rank, docs/launch.md
    assert out.feed("stdout", "lo from 1\r\n") == ["node2/3: hello from 1"]  # contract: as above
    stderr = out.feed("stderr", "W1122 torchrun warning\n[default1]:err line")
    assert stderr == ["node2: W1122 torchrun warning"]  # contract: torchrun's own line, after the node
    assert out.flush() == ["node2/3: err line"]
    assert list(out.tail)[-1] == "node2/3: err line"
    elastic = output.NodeOutput("node1", first_rank=None)
    assert elastic.feed("stdout", "[trainer3]:x\n") == ["node1/local3: x"]


# ---------------------------------------------------------------------------------------- same code


def hashed(directory, script="train.py", cwd=None, home=None, skip=()):
    """The node-side hashing program run here; HOME: the node's home (where launches are recorded)."""
    proc = subprocess.run(
        sameness.command(sys.executable, script, str(cwd or directory), skip),
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "HOME": str(home or directory.parent)},
    )
    return sameness.parse(proc.stdout)


def recorded(home, argv, stdin=None):
    subprocess.run(argv, input=stdin, text=True, check=True, env={**os.environ, "HOME": str(home)})


def test_environments_caches_run_directories_and_gitignored_files_are_not_the_code(tmp_path):
    code = tmp_path / "code"
    files = {
        "train.py": "print('train')\n",
        "lib/model.py": "LAYERS = 4\n",
        ".gitignore": "# outputs\n*.ckpt\n!keep.ckpt\ndata/\n/outputs\nlogs/*.txt\n",
        "keep.ckpt": "kept: negated",
        "nested/outputs/kept.py": "anchored /outputs is the top one only",
        "logs/kept.log": "only logs/*.txt are ignored",
        # not the code:
        ".venv/lib/site.py": "x",
        "venv/bin/python": "x",
        ".git/HEAD": "x",
        "lib/__pycache__/model.cpython-311.pyc": "x",
        "lib/stale.pyc": "x",
        "clustercheck-runs/launch-1/hosts/node1/output.log": "x",
        "model.ckpt": "x",
        "lib/epoch=1.ckpt": "x",
        "data/shard0.bin": "x",
        "outputs/run.json": "x",
        "logs/step.txt": "x",
        "my-runs/report.json": "the launch's own --run-dir",
    }
    for name, text in files.items():
        (code / name).parent.mkdir(parents=True, exist_ok=True)
        (code / name).write_text(text)
    expected = {".gitignore", "keep.ckpt", "lib/model.py", "logs/kept.log", "nested/outputs/kept.py", "train.py"}
    tree = hashed(code, skip=(str(code / "my-runs"),))
    assert set(tree.files) == expected and tree.error is None
    from clustercheck.launcher import codesync

    with tarfile.open(fileobj=io.BytesIO(codesync.archive(code, (str(code / "my-runs"),)))) as tar:
        assert set(tar.getnames()) == expected  # --sync uploads the same files


def test_what_rank_0_wrote_beside_the_script_does_not_make_a_later_launch_refuse(tmp_path):
    """Two nodes with the same code at the same path (here: two homes), as a launch records them."""
    homes = {n: tmp_path / n for n in ("node1", "node2")}
    for home in homes.values():
        (home / "code").mkdir(parents=True)
        (home / "code" / "train.py").write_text("print('train')\n")

    def trees():
        return {n: hashed(h / "code", home=h) for n, h in homes.items()}

    def at_one_path(all_trees):
        return {n: dataclasses.replace(t, directory="/srv/code") for n, t in all_trees.items()}

    def launch(job, writes_on_node1):
        before = trees()
        assert sameness.problems(at_one_path(before)) == []
        for n, h in homes.items():
            recorded(h, *sameness.begin_command(sys.executable, before[n], job, detached=False))
        for name, text in writes_on_node1.items():  # rank 0 runs on the first node
            (homes["node1"] / "code" / name).parent.mkdir(parents=True, exist_ok=True)
            (homes["node1"] / "code" / name).write_text(text)
        time.sleep(0.05)
        for n, h in homes.items():
            recorded(h, sameness.end_command(sys.executable, before[n].directory, job))

    launch("000000000001", {"model.pt": "weights", "lightning_logs/version_0/hparams.yaml": "lr: 0.1"})
    after = trees()
    assert sameness.problems(at_one_path(after)) == []
    assert set(after["node1"].outputs) == {"model.pt", "lightning_logs/version_0/hparams.yaml"}
    assert set(after["node1"].files) == {"train.py"}
    # The next launch overwrites the checkpoint and adds a version: still its output, not code.
    launch("000000000002", {"model.pt": "weights 2", "lightning_logs/version_1/hparams.yaml": "lr: 0.1"})
    assert sameness.problems(at_one_path(trees())) == []
    # A file the user adds on one node the moment after the runs is code again, and is named.
    (homes["node1"] / "code" / "model2.py").write_text("LAYERS = 8\n")
    (homes["node1"] / "code" / "model.pt").write_text("edited by hand, after the runs")
    (problem,) = sameness.problems(at_one_path(trees()))
    assert says(problem, "node2: ", "missing: model.pt, model2.py", "node1's /srv/code")


def test_identical_directories_pass_and_a_changed_missing_or_extra_file_is_named(tmp_path):
    trees = {}
    for name in ("node1", "node2", "node3"):
        code = tmp_path / name / "code"
        (code / "lib" / "__pycache__").mkdir(parents=True)
        (code / "train.py").write_text("print('train')\n")
        (code / "lib" / "model.py").write_text("LAYERS = 4\n")
        (code / "lib" / "__pycache__" / "model.cpython-311.pyc").write_bytes(name.encode())  # not compared

    # Each node's code lives at its own path here; on a cluster it is the same path, so compare by content.
    def at_one_path(tree):
        return sameness.Tree("/srv/code/train.py", "/srv/code", tree.files)

    assert sameness.problems({n: at_one_path(hashed(tmp_path / n / "code")) for n in ("node1", "node2", "node3")}) == []
    (tmp_path / "node2" / "code" / "lib" / "model.py").write_text("LAYERS = 5\n")
    (tmp_path / "node3" / "code" / "lib" / "model.py").unlink()
    (tmp_path / "node3" / "code" / "notes.txt").write_text("x")
    for name in ("node1", "node2", "node3"):
        trees[name] = at_one_path(hashed(tmp_path / name / "code"))
    node2, node3 = sameness.problems(trees)
    assert says(node2, "node2: ", "differs: lib/model.py", "node1's /srv/code")
    assert says(node3, "node3: ", "missing: lib/model.py", "only there: notes.txt", "node1's /srv/code")


def test_a_launch_whose_end_was_not_recorded_is_ended_by_the_next_one(tmp_path):
    """The control machine died during a foreground job: the next launch from the directory closes its window,
    so what the user adds after that is compared again."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('train')\n")
    first = hashed(tmp_path / "code", home=tmp_path)
    recorded(tmp_path, *sameness.begin_command(sys.executable, first, "000000000001", detached=False))
    (tmp_path / "code" / "model.pt").write_text("weights")  # never ended: the window is open until the next launch
    second = hashed(tmp_path / "code", home=tmp_path)
    assert set(second.outputs) == {"model.pt"}
    recorded(tmp_path, *sameness.begin_command(sys.executable, second, "000000000002", detached=False))
    recorded(tmp_path, sameness.end_command(sys.executable, second.directory, "000000000002"))
    later = time.time() + 5
    (tmp_path / "code" / "model2.py").write_text("LAYERS = 8\n")
    os.utime(tmp_path / "code" / "model2.py", (later, later))
    third = hashed(tmp_path / "code", home=tmp_path)
    assert set(third.files) == {"train.py", "model2.py"} and set(third.outputs) == {"model.pt"}


def test_a_missing_script_and_a_too_large_directory_are_named(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "train.py").write_text("x")
    missing = hashed(tmp_path / "a", script="nope.py")
    assert missing.error == "no such file"
    (unusable,) = sameness.unusable({"node1": hashed(tmp_path / "a"), "node2": missing})
    assert says(unusable, "node2: ", str(tmp_path / "a" / "nope.py"), "does not exist")
    monkeypatch.setattr(sameness, "MAX_FILES", 0)
    big = hashed(tmp_path / "a")
    assert big.error == "too large"
    (refused,) = sameness.unusable({"node1": big})
    assert refused.startswith(f"node1: {tmp_path / 'a'} holds more than 0 files or 512 MiB besides `.venv`")
    assert "too large to compare; pass --sync with a directory of the code alone" in refused
    assert f"to {tmp_path / 'a'}/.gitignore" in refused and "not the same" not in refused
    assert sameness.parse("Traceback ...\nboom").error.startswith("could not hash")


def test_a_script_at_another_path_is_named(tmp_path):
    one = sameness.Tree("/home/a/train.py", "/home/a", {"train.py": "1"})
    two = sameness.Tree("/home/b/train.py", "/home/b", {"train.py": "1"})
    (problem,) = sameness.problems({"node1": one, "node2": two})
    assert says(problem, "node2: ", "/home/b/train.py", "node1 /home/a/train.py")


# ---------------------------------------------------------------------------------------- detached jobs


def test_job_listing_and_its_summary_across_nodes():
    listed = detached.parse_list(
        "0123456789ab active - 1763780000\n"
        "ba9876543210 inactive 0 1763770000\n"
        "cafecafecafe failed - -\n"
        "not-a-job active - 1\n"
    )
    assert [(j.job, j.state) for j in listed] == [
        ("0123456789ab", "running"),
        ("ba9876543210", "exited 0"),
        ("cafecafecafe", "stopped"),
    ]
    assert listed[0].started == 1763780000.0 and listed[2].started is None
    running = listed[0]
    assert says(detached.summary({"node1": running, "node2": running}), "running on 2/2 node(s)")
    mixed = detached.summary({"node1": running, "node2": listed[1], "node3": None})
    assert says(mixed, "exited 0 on node2", "not there on node3", "running on node1")


def test_the_start_command_keeps_the_users_arguments_as_they_are():
    argv = detached.start_command(
        "0123456789ab", ["python", "train.py", "--name", "a b", "$HOME"], {"K": "v w"}, None, None
    )
    assert argv[:3] == ["sh", "-c", argv[2]] and "systemd-run" in argv[2]
    assert argv[3:] == ["sh", "0123456789ab", "", "", "env", "K=v w", "python", "train.py", "--name", "a b", "$HOME"]


@pytest.mark.skipif(os.path.isdir("/run/systemd/system"), reason="this machine runs systemd as PID 1")
def test_a_node_without_systemd_as_pid_1_refuses_a_detached_job_and_keeps_no_job(tmp_path):
    argv = detached.start_command("0123456789ab", ["true"], {}, None, None)
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "HOME": str(tmp_path)})
    assert proc.returncode == detached.REFUSED
    said = detached.start_problem(proc.returncode, proc.stderr)
    assert said.startswith("systemd is not running as PID 1 here (PID 1 is ") and "launch without --detach" in said
    listed = subprocess.run(detached.list_command(), capture_output=True, text=True, env={"HOME": str(tmp_path)})
    assert detached.parse_list(listed.stdout) == []


def test_systemd_runs_own_error_is_named_as_such():
    refused = detached.start_problem(1, "Failed to connect to bus: Host is down\n")
    assert says(refused, "systemd-run failed (exit 1)", "Failed to connect to bus: Host is down")
    lingering = "alice has no lingering systemd user manager, so a detached job would end at logout: run: ..."
    assert detached.start_problem(detached.REFUSED, lingering + "\n") == lingering  # verbatim: the node's refusal


def test_a_job_record_round_trips_and_an_unknown_job_says_how_to_reach_it(tmp_path, monkeypatch):
    from clustercheck.launcher import records

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    record = records.JobRecord(
        "0123456789ab", "/srv/inventory.ini", None, ["node1", "node2"], ["train.py"], 1.0, "/runs/x", {"node1": 0}
    )
    path = records.save(record)
    assert path == tmp_path / "clustercheck" / "jobs" / "0123456789ab.json"
    assert records.load("0123456789ab") == record
    with pytest.raises(records.RecordError, match="give --hosts INVENTORY"):
        records.load("ba9876543210")
