"""consistency.files: the configuration files the roles write, compared across the nodes (clustercheck/remote/
managed.py reads them on a node, checks/drift.py judges). The files are the roles' own templates rendered with the
roles' defaults by Ansible's templating (what site.yml writes); a node's copy is then edited the way an operator
edits it by hand, which each test says. The node side runs for real, on a directory per node."""

from __future__ import annotations

import json
import os
import shlex
from functools import cache
from pathlib import Path

import pytest
import yaml
from test_checks import node_facts

from clustercheck.checks import registry, setup_roles
from clustercheck.model import Status
from clustercheck.remote import managed

ROOT = Path(__file__).resolve().parents[2]
WRITES = ("template", "copy", "blockinfile", "lineinfile", "replace")  # the modules that write a file's content
RECORDS = Path(__file__).parent / "data" / "slurm"
SITE = ["ansible-playbook", "site.yml", "-i", "hosts.ini"]  # the fix line, before its nodes and roles


def _tasks(tasks, found, role):
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        for nested in ("block", "rescue", "always"):
            _tasks(task.get(nested), found, role)
        for key, args in task.items():
            if key.split(".")[-1] in WRITES and isinstance(args, dict):
                found.append((role, args.get("dest") or args.get("path"), args.get("marker")))


def role_writes() -> list[tuple[str, str, str | None]]:
    """(role, destination as written, blockinfile's marker) of every task of roles/*/tasks that writes a file."""
    found: list = []
    for path in sorted(ROOT.glob("roles/*/tasks/*.yml")):
        _tasks(yaml.safe_load(path.read_text()), found, path.parts[-3])
    return found


def test_every_file_a_role_writes_is_compared_or_left_out_with_why():
    named = {(m.role, m.writes) for m in managed.MANAGED}
    writes = role_writes()
    unnamed = sorted({(role, dest) for role, dest, _ in writes} - named - set(managed.LEFT_OUT))
    assert not unnamed, f"a role writes files clustercheck neither compares nor says why not: {unnamed}"
    texts = {r.name: " ".join(p.read_text() for p in (r / "tasks").glob("*.yml")) for r in (ROOT / "roles").iterdir()}
    stale = sorted(  # the munge key is written by a shell task (base64 -d > {{ slurm_munge_key }}.new)
        (role, dest)
        for role, dest in (named | set(managed.LEFT_OUT)) - {(role, dest) for role, dest, _ in writes}
        if dest not in texts.get(role, "")
    )
    assert not stale, f"named, but no role writes them: {stale}"
    markers = {(role, dest): marker for role, dest, marker in writes if marker}
    for entry in (m for m in managed.MANAGED if m.kind == managed.BLOCK):
        assert markers[(entry.role, entry.writes)] == entry.marker  # the block the role writes, no more
    assert all(why for why in managed.LEFT_OUT.values())
    playbook = yaml.safe_load((ROOT / "playbooks/nodes.yml").read_text())
    tags = {t for play in playbook for r in play.get("roles", []) if isinstance(r, dict) for t in r.get("tags", [])}
    assert {m.tag for m in managed.MANAGED} <= tags  # what the fix re-runs is a role's tag in site.yml


def _vars(*paths: str) -> dict:
    out: dict = {"ansible_managed": "Ansible managed"}
    for path in paths:
        if (ROOT / path).exists():
            out.update(yaml.safe_load((ROOT / path).read_text()) or {})
    return out


def _render(text: str, variables: dict) -> str:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(text))


@cache
def slurm_conf() -> str:
    """roles/slurm/templates/slurm.conf.j2 as the slurm role writes it for three nodes of two CPUs (its set_fact
    settings rendered too)."""
    variables = _vars("roles/slurm/defaults/main.yml", "roles/slurm/vars/main.yml")
    nodes = ["node1", "node2", "node3"]
    facts = {"processor_vcpus": 2, "processor_count": 1, "processor_cores": 2, "processor_threads_per_core": 1}
    hostvars = {n: {"ansible_facts": {"hostname": n, "memtotal_mb": 7951, **facts}} for n in nodes}
    variables.update(
        slurm_version="23.11.4",
        slurm_controller="node1",
        slurm_nodes=nodes,
        nvidia_gpu_count=0,
        slurm_health_check_timeout_written=False,
    )
    settings = {}
    for task in yaml.safe_load((ROOT / "roles/slurm/tasks/main.yml").read_text()):
        settings.update(task.get("ansible.builtin.set_fact") or {})
    for n in nodes:
        hostvars[n]["slurm_node_line"] = _render(settings["slurm_node_line"], {**variables, **hostvars[n]})
    scope = {**variables, **hostvars["node1"], "hostvars": hostvars}
    variables["slurm_conf_restart"] = [_render(line, scope) for line in settings["slurm_conf_restart"]]
    variables["slurm_conf_reconfigure"] = _render(settings["slurm_conf_reconfigure"], scope)
    return _render((ROOT / "roles/slurm/templates/slurm.conf.j2").read_text(), {**variables, "hostvars": hostvars})


@cache
def chrony_conf(server: str = "") -> str:
    """roles/base/templates/chrony.conf.j2 as the base role writes it for chrony 4.3 (Debian 12): with the role's
    defaults, or as the test cluster's variables (tests/ansible/testcluster-vars.yml) make it, node1 serving time to
    its network and the other nodes its clients (SERVER: node1's address; "node1": node1's own)."""
    variables = {**_vars("roles/base/defaults/main.yml"), "base_chrony_version": "4.3"}
    if server == "node1":
        variables.update(base_chrony_pools=[], base_chrony_allow=["172.29.0.0/24"], base_chrony_local_stratum=10)
    elif server:
        variables.update(base_chrony_pools=[], base_chrony_servers=[server])
    return _render((ROOT / "roles/base/templates/chrony.conf.j2").read_text(), variables)


@cache
def limits_conf() -> str:
    return _render((ROOT / "roles/base/templates/limits.conf.j2").read_text(), _vars("roles/base/defaults/main.yml"))


def node(tmp_path: Path, name: str, files: dict[str, str | bytes], modes: dict[str, int] | None = None):
    """NAME's facts with the managed files FILES (path -> content) as the node side reads them from a directory."""
    root = tmp_path / name
    for path, content in files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content if isinstance(content, bytes) else content.encode())
        os.chmod(target, (modes or {}).get(path, 0o644))
    answer = managed.managed_files(str(root), prefix=str(root / "opt/venvs/torch"), home=str(root / "root"))
    return node_facts(name=name, managed_files=json.loads(json.dumps(answer)))  # through JSON, as it travels


def files_check(nodes):
    (result,) = [r for r in registry.run_cluster_checks(nodes, None) if r.name == "consistency.files"]
    return result


def test_node3s_slurm_conf_with_one_setting_changed_is_named_with_the_line_and_the_fix(tmp_path):
    """The issue's case: node3's slurm.conf edited by hand, HealthCheckInterval 300 made 600."""
    same = {"/etc/slurm/slurm.conf": slurm_conf(), "/etc/chrony/chrony.conf": chrony_conf()}
    assert "HealthCheckInterval=300\n" in slurm_conf()
    edited = {
        **same,
        "/etc/slurm/slurm.conf": slurm_conf().replace("HealthCheckInterval=300", "HealthCheckInterval=600"),
    }
    nodes = [node(tmp_path, "node1", same), node(tmp_path, "node2", same), node(tmp_path, "node3", edited)]
    result = files_check(nodes)
    assert result.status is Status.FAIL
    first = result.message.splitlines()[0]
    assert first.startswith("node3: /etc/slurm/slurm.conf")
    assert "-HealthCheckInterval=300" in first and "+HealthCheckInterval=600" in first
    assert "role slurm" in first and "node1 and node2" in first
    assert "--- /etc/slurm/slurm.conf (node1)" in result.message  # the unified diff below it
    (fixed,) = setup_roles.with_fix_commands([result], "hosts.ini")
    assert shlex.split(fixed.fix_command) == [*SITE, "--limit", "node3", "--tags", "slurm"]
    assert [d["path"] for d in result.data["differ"]] == ["/etc/slurm/slurm.conf"]  # chrony.conf is the same


def test_a_drifted_chrony_conf_and_a_lost_limits_file_each_name_their_node_and_role(tmp_path):
    """Another instance the code does not name, on chrony.conf as the test cluster's variables make it (node1 serves
    time, its lines differ from its clients' by design): node2's `makestep 1 3` made `makestep 1 -1` by hand, and
    node1's limits file deleted."""
    limits = {"/etc/security/limits.d/90-clustercheck.conf": limits_conf()}
    client = chrony_conf("172.29.0.11")
    server = {"/etc/chrony/chrony.conf": chrony_conf("node1")}
    healthy = [
        node(tmp_path, "node1", {**server, **limits}),
        node(tmp_path, "node2", {"/etc/chrony/chrony.conf": client, **limits}),
        node(tmp_path, "node3", {"/etc/chrony/chrony.conf": client, **limits}),
    ]
    assert "allow 172.29.0.0/24" in chrony_conf("node1") and "server 172.29.0.11 iburst" in client
    assert files_check(healthy).status is Status.PASS  # the time server's own lines are its own
    assert "makestep 1 3\n" in client
    drifted = {"/etc/chrony/chrony.conf": client.replace("makestep 1 3", "makestep 1 -1"), **limits}
    nodes = [node(tmp_path / "b", "node1", server), node(tmp_path / "b", "node2", drifted), healthy[2]]
    result = files_check(nodes)
    assert result.status is Status.FAIL
    first = result.message.splitlines()[0]
    assert "node1: /etc/security/limits.d/90-clustercheck.conf is missing" in first
    assert "node2: /etc/chrony/chrony.conf differs" in first and "-makestep 1 3 +makestep 1 -1" in first
    assert first.index("node1:") < first.index("node2:")
    (fixed,) = setup_roles.with_fix_commands([result], "hosts.ini")
    assert shlex.split(fixed.fix_command) == [*SITE, "--limit", "node1,node2", "--tags", "base"]


def test_a_file_on_fewer_nodes_than_not_is_a_role_used_there_only(tmp_path):
    """The driver role's files on one node of three (a GPU node beside two without): no finding."""
    pin = "Pin-Priority: 1001\n"  # a line of the role's driver-pin.j2, as it writes it
    assert pin.strip() in (ROOT / "roles/nvidia_driver/templates/driver-pin.j2").read_text()
    nodes = [node(tmp_path, "node1", {"/etc/apt/preferences.d/clustercheck-nvidia-driver": pin})]
    nodes += [node(tmp_path, name, {}) for name in ("node2", "node3")]
    assert files_check(nodes).status is Status.PASS


def test_every_line_that_varies_by_design_says_why():
    varying = {m.path for m in managed.MANAGED if m.varies is not None}
    assert varying == set(managed.VARIED_BY) and all(managed.VARIED_BY.values())


def test_a_key_is_compared_by_its_hash_and_never_leaves_the_node(tmp_path):
    """node2's munge key replaced (another key, as a re-imaged node's package makes one); the files are random bytes
    with the key's mode, 0400."""
    keys = {name: os.urandom(1024) for name in ("node1", "node2")}
    nodes = [
        node(tmp_path, name, {"/etc/munge/munge.key": keys[key]}, {"/etc/munge/munge.key": 0o400})
        for name, key in (("node1", "node1"), ("node2", "node2"), ("node3", "node1"))
    ]
    copy = nodes[1].managed_files.files["/etc/munge/munge.key"]
    assert copy.text is None and copy.sha256 and copy.size == 1024
    assert "text" not in json.dumps(nodes[1].raw["managed_files"])
    result = files_check(nodes)
    assert result.status is Status.FAIL
    assert result.message.startswith("node2: /etc/munge/munge.key differs") and "SHA-256" in result.message
    (fixed,) = setup_roles.with_fix_commands([result], "hosts.ini")
    assert shlex.split(fixed.fix_command) == [*SITE, "--limit", "node2", "--tags", "slurm"]


def test_a_file_readable_by_its_owner_only_is_not_shown(tmp_path):
    copy = node(tmp_path, "node1", {"/etc/nccl.conf": "NCCL_DEBUG=WARN\n"}, {"/etc/nccl.conf": 0o600})
    assert copy.managed_files.files["/etc/nccl.conf"].text is None


HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{own}\n"
BLOCK = "# BEGIN clustercheck cluster_hosts\n{lines}# END clustercheck cluster_hosts\n"
MAPPING = "172.29.0.11 node1\n172.29.0.12 node2\n172.29.0.13 node3\n"


def test_only_the_block_the_hosts_role_writes_is_compared(tmp_path):
    """Each node's own lines of /etc/hosts differ (Docker writes its address and name there); the role's block is the
    same, until node3's has one address changed by hand."""
    nodes = [
        node(
            tmp_path,
            f"node{i}",
            {"/etc/hosts": HOSTS.format(own=f"172.17.0.{i}\tnode{i}") + BLOCK.format(lines=MAPPING)},
        )
        for i in (1, 2, 3)
    ]
    assert files_check(nodes).status is Status.PASS
    changed = MAPPING.replace("172.29.0.12 node2", "172.29.0.99 node2")
    nodes[2] = node(
        tmp_path / "again", "node3", {"/etc/hosts": HOSTS.format(own="172.17.0.3\tnode3") + BLOCK.format(lines=changed)}
    )
    result = files_check(nodes)
    assert result.status is Status.FAIL
    assert result.message.startswith("node3: /etc/hosts differs") and "+172.29.0.99 node2" in result.message
    assert "cluster_hosts" in result.message and "172.17.0" not in result.message


def test_files_no_node_has_are_no_finding_and_the_same_files_pass(tmp_path):
    same = {"/etc/slurm/slurm.conf": slurm_conf()}
    result = files_check([node(tmp_path, f"node{i}", same) for i in (1, 2, 3)])
    assert result.status is Status.PASS and result.data["files"] == ["/etc/slurm/slurm.conf"]
    assert files_check([node(tmp_path / "none", f"node{i}", {}) for i in (1, 2)]).status is Status.PASS


def test_two_nodes_that_differ_have_no_majority_and_both_are_named(tmp_path):
    edited = slurm_conf().replace("ReturnToService=2", "ReturnToService=1")
    nodes = [
        node(tmp_path, "node1", {"/etc/slurm/slurm.conf": slurm_conf()}),
        node(tmp_path, "node2", {"/etc/slurm/slurm.conf": edited}),
    ]
    result = files_check(nodes)
    assert result.status is Status.FAIL and "no copy is the majority's" in result.message
    assert setup_roles.nodes_of(result) == ["node1", "node2"]


def test_slurmctlds_own_word_on_the_node_is_quoted(tmp_path):
    """slurmctld's log on the controller holds the lines a public Slurm 22.05.8 cluster's slurmctld logged for its
    worker2 (tests/unit/data/slurm/README.md), the nodes named as there; worker2's slurm.conf has one setting
    changed."""
    log = (RECORDS / "slurmctld-conf-hash-vagrant.log").read_text()
    conf = slurm_conf()
    controller = {"/etc/slurm/slurm.conf": conf, "/var/log/slurm/slurmctld.log": log}
    edited = conf.replace("HealthCheckInterval=300", "HealthCheckInterval=600")
    nodes = [
        node(tmp_path, "master", controller),
        node(tmp_path, "worker1", {"/etc/slurm/slurm.conf": conf}),
        node(tmp_path, "worker2", {"/etc/slurm/slurm.conf": edited}),
    ]
    assert len(nodes[0].managed_files.slurmctld) == 4  # worker1's three lines and worker2's one, nothing else
    result = files_check(nodes)
    assert result.message.startswith("worker2: /etc/slurm/slurm.conf differs")
    quoted = [line for line in result.message.splitlines() if line.startswith("slurmctld logs for worker2")]
    assert len(quoted) == 1 and "Node worker2 appears to have a different slurm.conf than the slurmctld" in quoted[0]


@pytest.mark.parametrize("path", ["/etc/munge/munge.key", "/root/.ssh/id_cluster_ed25519", "/x/secret.conf"])
def test_key_like_names_are_never_shown(path):
    assert not managed.shown(path, managed.TEXT, 0o644)


def test_files_of_two_roles_on_two_nodes_give_one_line_that_reruns_both(tmp_path):
    """node3's slurm.conf and node2's chrony.conf edited by hand at once (as on the torch test cluster, 2026-11-29)."""
    same = {"/etc/slurm/slurm.conf": slurm_conf(), "/etc/chrony/chrony.conf": chrony_conf()}
    node2 = {**same, "/etc/chrony/chrony.conf": chrony_conf().replace("makestep 1 3", "makestep 1 -1")}
    node3 = {**same, "/etc/slurm/slurm.conf": slurm_conf().replace("ReturnToService=2", "ReturnToService=1")}
    nodes = [node(tmp_path, "node1", same), node(tmp_path, "node2", node2), node(tmp_path, "node3", node3)]
    result = files_check(nodes)
    first = result.message.splitlines()[0]
    assert first.startswith("node2: /etc/chrony/chrony.conf") and "; node3: /etc/slurm/slurm.conf" in first
    (fixed,) = setup_roles.with_fix_commands([result], "hosts.ini")
    assert shlex.split(fixed.fix_command) == [*SITE, "--limit", "node2,node3", "--tags", "base,slurm"]
