"""slurm: slurmctld answers, every Slurm node is in sinfo and not down, srun reaches them all, munge holds one key
everywhere (compared by hash, never shown) readable by munge only, and Slurm counts each node's GPUs. Checked where
the inventory sets slurm_enabled: true."""

from __future__ import annotations

import re

import pytest
from acceptance_helpers import setting

TRUE = ("true", "yes", "1")


def enabled(runner, name: str) -> bool:
    return str(setting(runner, name, "slurm_enabled", "slurm")).lower() in TRUE


@pytest.fixture
def slurm_node(host, runner) -> str:
    """This node's name in Slurm (its short hostname), where the inventory enables Slurm on it."""
    if not enabled(runner, host.backend.get_hostname()):
        pytest.skip("slurm_enabled is not true for this node in the inventory: the slurm role is not applied")
    return host.check_output("hostname -s")


@pytest.fixture(scope="session")
def slurm_peers(runner, peers) -> dict:
    """The Slurm nodes (inventory name -> testinfra host)."""
    found = {name: peer for name, peer in peers.items() if enabled(runner, name)}
    if not found:
        pytest.skip("slurm_enabled is not true for any node in the inventory: the slurm role is not applied")
    return found


@pytest.fixture(scope="session")
def controller(runner, slurm_peers):
    """The controller: the first host of the slurm_controller group, else the first Slurm node (the role's default)."""
    named = [name for name in runner.get_hosts("slurm_controller") if name in slurm_peers]
    return slurm_peers[(named or sorted(slurm_peers))[0]]


def test_munge_and_slurmd_run_and_start_at_boot(host, slurm_node):
    for unit in ("munge", "slurmd"):
        service = host.service(unit)
        assert service.is_running and service.is_enabled, f"{unit} on {slurm_node}"


def test_slurmctld_answers(host, slurm_node):
    out = host.run("scontrol ping")
    assert out.rc == 0 and re.search(r"\bis UP\b", out.stdout), (
        f"scontrol ping on {slurm_node}: {out.stdout}{out.stderr}"
    )


def test_the_munge_key_is_readable_by_munge_only(host, slurm_node):
    key = host.file("/etc/munge/munge.key")
    with host.sudo():
        assert key.exists and key.user == "munge" and key.mode == 0o400, f"/etc/munge/munge.key on {slurm_node}"


def test_every_node_holds_the_same_munge_key(slurm_peers):
    hashes = {}
    for name, peer in slurm_peers.items():
        with peer.sudo():
            hashes[name] = peer.check_output("sha256sum /etc/munge/munge.key").split()[0]
    groups = {}
    for name, digest in hashes.items():
        groups.setdefault(digest, []).append(name)
    assert len(groups) == 1, "the munge keys differ: " + " / ".join(", ".join(sorted(g)) for g in groups.values())


def test_the_node_is_in_sinfo_and_not_down(host, slurm_node):
    state = host.check_output(f"sinfo --noheader --Node --nodes={slurm_node} --format=%T").strip()
    assert state, f"{slurm_node} is not in sinfo"
    assert not re.match(r"(down|drain|fail|unknown|inval|not_responding)", state.lower()), f"{slurm_node}: {state}"


def test_srun_runs_on_every_node(controller, slurm_peers):
    names = {peer.check_output("hostname -s") for peer in slurm_peers.values()}
    out = controller.run(f"timeout 120 srun --nodes={len(names)} --ntasks-per-node=1 hostname -s")
    assert out.rc == 0, f"srun: {out.stdout}{out.stderr}"
    assert set(out.stdout.split()) == names


def node_gpus(host) -> int:
    """The NVIDIA GPUs the node's driver lists (none where no driver is loaded)."""
    if host.exists("nvidia-smi"):
        listed = host.run("nvidia-smi -L")
        if listed.rc == 0:
            return len(re.findall(r"^GPU \d+:", listed.stdout, re.M))
    return 0


def test_slurm_counts_the_nodes_gpus(host, slurm_node):
    shown = host.check_output(f"scontrol show node {slurm_node}")
    gres = re.search(r"\bGres=(\S+)", shown)
    counted = sum(int(m) for m in re.findall(r"gpu(?::[^:,(]+)?:(\d+)", gres[1] if gres else ""))
    assert counted == node_gpus(host), f"scontrol show node {slurm_node}: Gres={gres[1] if gres else '(none)'}"
