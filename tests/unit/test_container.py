"""--container: the docker run line (through a real shell), what Docker's recorded answers mean, and the checks that
judge them (tests/unit/data/docker/README.md says where each answer was recorded)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

from test_checks import by_name, node_facts
from wording import says

from clustercheck.checks import consistency
from clustercheck.container import Container, image_of, run_problem
from clustercheck.stages import launch
from clustercheck.transport import CommandResult

DATA = Path(__file__).parent / "data" / "docker"


def recorded(name: str) -> CommandResult:
    answer = json.loads((DATA / f"{name}.json").read_text())
    return CommandResult(answer["exit"], answer["stdout"], answer["stderr"])


def as_run_on_a_node(argv: list[str], tmp_path: Path, env: dict[str, str]) -> list[str]:
    """ARGV run by a real sh with a `docker` on PATH that prints the arguments it was given, one per line."""
    fake = tmp_path / "bin" / "docker"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    fake.chmod(0o755)
    environment = {**os.environ, **env, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    done = subprocess.run(argv, env=environment, capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def test_docker_run_is_nvidias_line_as_the_node_user_with_the_run_marked(tmp_path):
    box = Container("nvcr.io/nvidia/pytorch:25.01-py3", ("--shm-size=16g", "--ulimit", "memlock=8388608:8388608"))
    # The run's work directory on the node (the line makes it when missing): here, one of the test's own.
    workdir = tmp_path / "clustercheck-abc"
    argv = box.run(["python3", "-c", "print(1)"], workdir=f"{workdir}/", gpus=True, env=("NCCL_DEBUG",))
    got = as_run_on_a_node(argv, tmp_path, {"CLUSTERCHECK_RUN": "abc", "NCCL_DEBUG": "INFO"})
    image = got.index(box.image)
    options, command = got[:image], got[image + 1 :]
    assert command == ["python3", "-c", "print(1)"]
    assert options[:2] == ["run", "--rm"]
    assert options[options.index("--user") + 1] == f"{os.getuid()}:{os.getgid()}"
    assert "clustercheck.run=abc" in options  # the label the node shell filled in from the run's marker
    text = " ".join(options)
    for nvidia in ("--network host", "--ipc host", "--ulimit memlock=-1", "--ulimit stack=67108864", "--gpus all"):
        assert nvidia in text
    assert f"-v {workdir}:{workdir} -w {workdir}" in text and workdir.is_dir()
    assert "-e CLUSTERCHECK_RUN -e CLUSTERCHECK_UNTIL -e NCCL_DEBUG" in text  # passed from the node's environment
    # the user's own options last, so that theirs win where Docker takes the last (--ulimit memlock here)
    assert options[-3:] == ["--shm-size=16g", "--ulimit", "memlock=8388608:8388608"]
    cpu = as_run_on_a_node(
        box.run(["true"], workdir=str(tmp_path / "w"), gpus=False), tmp_path, {"CLUSTERCHECK_RUN": "abc"}
    )
    assert "--gpus" not in cpu


def test_the_torchrun_planner_puts_every_node_environment_variable_into_the_container():
    box = Container("img:1")
    nodes = [launch.NodeSpec("n1", "10.0.0.1", 0, "/usr/bin/python3", "/tmp/clustercheck-x", box)]
    (plan,) = launch.plan(nodes, worker="ddp", stage="ddp", master_port=29500, interface="eth0")
    line = plan.shell()
    assert line.startswith("env ") and "NCCL_SOCKET_IFNAME=eth0" in line
    image = plan.command.index("img:1")
    assert plan.command[image + 1 : image + 4] == ["/usr/bin/python3", "-m", "torch.distributed.run"]
    passed = {plan.command[i + 1] for i, word in enumerate(plan.command[:image]) if word == "-e"}
    assert set(plan.env) <= passed
    own = launch.NodeSpec("n1", "10.0.0.1", 0, "/opt/env/bin/python", "/tmp/clustercheck-x")
    host = launch.plan([own], worker="ddp", stage="ddp", master_port=29500, interface="eth0")
    assert host[0].command[5] == "/opt/env/bin/python"  # after the cd into the run directory (launch.IN_RUN_DIR)


def test_what_docker_answered_on_a_node():
    box = Container("cc-torch:test")
    there = image_of(box, recorded("inspect-present"))
    assert there.problem is None
    assert there.id == "sha256:5200d1e5343975fb3d3b13d14b18374bccc87d1160c2b558cb0afabdd80b394d" and not there.digests
    absent = image_of(Container("cc-torch:absent"), recorded("inspect-absent"))
    assert says(absent.image_problem, "cc-torch:absent", "not on the node") and absent.docker_problem is None
    denied = image_of(box, recorded("inspect-permission-denied"), user="nobody")
    assert denied.docker_problem.startswith("nobody may not use Docker: permission denied")
    down = image_of(box, recorded("inspect-no-daemon"))
    assert down.docker_problem.startswith("the Docker daemon is not running: Cannot connect")
    missing = image_of(box, recorded("inspect-not-installed"))
    assert says(missing.docker_problem, "docker is not installed", "command not found")


def test_dockers_own_refusal_is_the_line_given_with_what_to_do_about_memlock():
    said = run_problem(recorded("run-memlock-refused"))
    assert said.startswith("exit 125: docker: Error response from daemon:")
    assert "rlimit type 8" in said and "--container-option=--ulimit=memlock=N:N" in said
    gpus = run_problem(recorded("run-gpus-no-toolkit"))
    assert gpus.startswith('exit 125: docker: Error response from daemon: could not select device driver ""')
    assert "nvidia-ctk runtime configure --runtime=docker" in gpus
    missing_python = run_problem(CommandResult(127, "", "sh: 1: exec: python3: not found\n"))
    assert says(missing_python, "exit 127", "python3: not found")


def with_image(name: str, answer: str, **kw):
    facts = node_facts(name=name, **kw)
    found = image_of(Container("cc-torch:test"), recorded(answer))
    facts = replace(facts, image=found if found.problem else replace(found, python="/usr/bin/python3"))
    return facts


def test_the_container_checks_say_which_part_fails_and_skip_without_container():
    plain = by_name(node_facts())
    assert all(plain[n].status.name == "SKIP" for n in ("container.docker", "container.image"))
    good = by_name(with_image("node1", "inspect-present"))
    assert good["container.docker"].status.name == "PASS" and good["container.image"].status.name == "PASS"
    assert "no digest" in good["container.image"].message
    denied = by_name(with_image("node1", "inspect-permission-denied"))
    assert denied["container.docker"].status.name == "FAIL"
    assert denied["container.image"].status.name == "SKIP"  # one cause, one FAIL
    assert denied["torch.import"].status.name == "SKIP" and denied["python.env"].status.name == "SKIP"
    gone = by_name(with_image("node1", "inspect-absent"))
    assert (
        gone["container.image"].status.name == "FAIL"
        and "docker pull cc-torch:test" in gone["container.image"].remediation
    )


def test_consistency_image_names_the_node_whose_image_differs():
    nodes = [with_image(f"node{i}", "inspect-present") for i in (1, 2)]
    nodes.append(with_image("node3", "inspect-present-other"))
    found = consistency.image(nodes, None)
    assert found.status.name == "FAIL"
    assert found.message.startswith("image cc-torch:test ID differs: node3 has sha256:4f32fee14dd8")
    assert consistency.image(nodes[:2], None).status.name == "PASS"
    assert consistency.image([node_facts(), node_facts(name="node2")], None).message == "no --container image"
