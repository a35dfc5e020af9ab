"""Each role runs on its own (`--tags X`) and with any other role skipped (`--skip-tags X`): the roles that
need to know the node's GPUs (nvidia_driver, cuda_toolkit, nccl, python_env) each bring the detection
(role nvidia_gpu) under their own tag, so no selection of tags leaves one of them without it.

The tags look alike in every role: each task of a role site.yml applies carries that role's tag, the one site.yml
gives it, so that `--tags X` selects the same tasks in a play of the user's own that lists the role without tags. The
roles that only others use (nvidia_gpu, nvidia_repo, clustercheck_tool, wheelhouse) carry none: each use gives them
the user's tag, and none of them is a tag that, skipped, would leave a role without what it needs.

Checked on what ansible-playbook itself selects (--list-tasks on site.yml) and on the task files; the stand-in tests
run the selections that once failed on a node."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent.parent
ROLES = [r["role"] for r in yaml.safe_load((REPO / "playbooks" / "nodes.yml").read_text())[1]["roles"]]
NEEDS_GPU = ["nvidia_driver", "cuda_toolkit", "nccl", "python_env"]
DETECT = "nvidia_gpu : NVIDIA GPU | PROBE |"
TASK = re.compile(r"^\s{6}(\S+) : (.*?)\tTAGS: \[(.*)\]$", re.M)


@functools.cache
def listed(*args: str, playbook: Path = REPO / "site.yml") -> list[tuple[str, str]]:
    """(role, task) in the order PLAYBOOK (site.yml) would run them with ARGS."""
    ansible_playbook = str(Path(sys.executable).parent / "ansible-playbook")
    proc = subprocess.run(
        [ansible_playbook, "-i", "localhost,", "--list-tasks", *args, str(playbook)],
        cwd=REPO,
        env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return [(m[1], m[2]) for m in TASK.finditer(proc.stdout) if not m[2].startswith("Validating arguments")]


@pytest.mark.parametrize("selection", [f"--tags={r}" for r in ROLES] + [f"--skip-tags={r}" for r in ROLES])
def test_gpu_detection_runs_before_every_role_that_needs_it(selection):
    tasks = listed(selection)
    for role in NEEDS_GPU:
        positions = [i for i, (r, _) in enumerate(tasks) if r == role]
        if not positions:
            continue  # the role is not selected
        detections = [i for i, (r, t) in enumerate(tasks) if f"{r} : {t}".startswith(DETECT)]
        assert detections and detections[0] < positions[0], f"{selection}: {role} runs without GPU detection before it"


def test_detection_is_its_own_role_not_tagged_with_others():
    tasks = listed("--skip-tags=python_env")
    assert any(r == "nvidia_driver" for r, _ in tasks), "nvidia_driver must run when python_env is skipped"
    assert DETECT in "\n".join(f"{r} : {t}" for r, t in tasks)
    assert "nvidia_gpu" not in ROLES, "detection is imported by the roles that need it, not listed in the play"


def test_every_fix_command_names_a_tag_of_site_yml_and_a_check_of_the_registry():
    """The mapping from checks to the roles that set what they check (checks/setup_roles.py) stays in step with
    site.yml's real tags, as ansible-playbook lists them, and with the check registry."""
    from clustercheck.checks import REGISTRY, setup_roles

    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "--list-tags", "site.yml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    tags = {t.strip() for line in re.findall(r"TASK TAGS: \[(.*)\]", proc.stdout) for t in line.split(",")}
    assert set(setup_roles.ROLE_OF.values()) <= tags - {"always"}
    assert set(setup_roles.ROLE_OF) <= set(REGISTRY)


ALL_ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if p.is_dir())
USED_BY_OTHERS = sorted(set(ALL_ROLES) - set(ROLES))
INCLUDES = ("ansible.builtin.include_role", "include_role")


def _tags(entry: dict) -> list[str]:
    tags = entry.get("tags", [])
    return [tags] if isinstance(tags, str) else list(tags)


def tasks_of(role: str):
    """(file, task, tags) for every task in ROLE's task files, a block's tasks with the block's tags, which they
    inherit, before their own."""

    def walk(entries, inherited):
        for entry in entries or []:
            tags = inherited + [t for t in _tags(entry) if t not in inherited]
            if "block" in entry:
                for key in ("block", "rescue", "always"):
                    yield from walk(entry.get(key), tags)
            else:
                yield entry, tags

    for path in sorted((REPO / "roles" / role / "tasks").glob("*.yml")):
        for task, tags in walk(yaml.safe_load(path.read_text()), []):
            yield path.name, task, tags


def test_the_task_file_reader_sees_blocks_and_their_tags():
    found = {task["name"]: tags for _, task, tags in tasks_of("monitoring")}
    assert found["Monitoring | PATCH | Start the timer now and at boot"] == ["monitoring"]  # in a tagged block
    assert found["Monitoring | SETUP | Name the firewall rule that lets Prometheus reach node_exporter"] == [
        "monitoring",
        "firewall",
    ]
    assert set(USED_BY_OTHERS) == {"nvidia_gpu", "nvidia_repo", "clustercheck_tool", "wheelhouse"}


@pytest.mark.parametrize("role", ROLES)
def test_every_task_of_a_role_carries_the_roles_tag(role):
    """Tagged as site.yml tags the role, on the task itself: in a play that lists the role without tags (or one that
    includes a task file of it), `--tags ROLE` still selects it. A fact another role reads may carry that role's tag
    too, so that `--tags` of that role alone computes it (monitoring's firewall rule, read by firewall)."""
    for name, task, tags in tasks_of(role):
        where = f"roles/{role}/tasks/{name}: {task.get('name')}"
        assert tags[:1] == [role], f"{where} is tagged {tags}, not [{role}] like the role's other tasks"
        if tags[1:]:
            assert "ansible.builtin.set_fact" in task and set(tags[1:]) <= set(ROLES) - {role}, (
                f"{where} carries {tags[1:]} besides its role's tag: only a fact another role reads may"
            )


@pytest.mark.parametrize("role", ROLES)
def test_a_role_included_by_a_role_runs_under_that_roles_tag(role):
    """include_role is dynamic: the tags of the task that includes are not those of the included tasks unless it
    applies them. import_role passes the task's tags on by itself."""
    for name, task, _ in tasks_of(role):
        if not any(key in task for key in INCLUDES):
            continue
        applied = _tags(task.get(next(k for k in INCLUDES if k in task), {}).get("apply", {}))
        assert applied == [role], f"roles/{role}/tasks/{name}: {task['name']} includes a role without applying [{role}]"


@pytest.mark.parametrize("role", USED_BY_OTHERS)
def test_a_role_only_others_use_has_no_tag_of_its_own(role):
    """Its tasks run under the tag of the role that uses them: a tag of its own would be one that --skip-tags could
    take from every role that needs it (nvidia_gpu's detection), or that --tags would select without the role that
    includes it (include_role) and so select nothing."""
    tagged = [(name, task["name"], tags) for name, task, tags in tasks_of(role) if tags]
    assert tagged == []


def _untagged_site(directory: Path) -> Path:
    """site.yml's plays with the roles listed without their tags, as a play of a user's own lists them."""
    plays = yaml.safe_load((REPO / "playbooks" / "nodes.yml").read_text())
    for play in plays:
        for entry in play.get("roles", []):
            entry.pop("tags", None)
    path = directory / "untagged.yml"
    path.write_text(yaml.safe_dump(plays, sort_keys=False))
    (directory / "tasks").symlink_to(REPO / "playbooks" / "tasks")  # the task files its plays import
    return path


@pytest.mark.parametrize("role", ROLES)
def test_tags_select_the_same_tasks_with_or_without_the_plays_tags(role, tmp_path):
    """ansible-playbook --list-tasks: `--tags ROLE` on a play that lists the roles untagged selects exactly what it
    selects on site.yml."""
    site = listed(f"--tags={role}")
    assert any(r == role for r, _ in site), f"--tags={role} selects none of {role}'s tasks on site.yml"
    assert listed(f"--tags={role}", playbook=_untagged_site(tmp_path)) == site
