"""The test cluster itself: nodes are real hosts, reached over SSH with host-key checking on."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import nodeimages
import paramiko
import pytest
import testcluster

pytestmark = pytest.mark.cluster


def inventory_hosts(path: str) -> dict[str, str]:
    """Node name -> address, read the way Ansible reads the inventory."""
    listing = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", path, "--list"],
        check=True,
        capture_output=True,
        text=True,
    )
    data = json.loads(listing.stdout)
    hostvars = data["_meta"]["hostvars"]
    return {name: hostvars[name]["ansible_host"] for name in data["gpu_nodes"]["hosts"]}


def ssh(address: str, known_hosts: str, key_file: str, user: str = "root") -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.load_host_keys(known_hosts)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(address, username=user, key_filename=key_file, timeout=10, allow_agent=False, look_for_keys=False)
    return client


def run_on(client: paramiko.SSHClient, command: str) -> tuple[int, str]:
    _, stdout, stderr = client.exec_command(command, timeout=300)
    out = stdout.read().decode() + stderr.read().decode()
    return stdout.channel.recv_exit_status(), out


def test_every_node_answers_over_ssh_with_host_key_checking(bare_cluster):
    hosts = inventory_hosts(bare_cluster.inventory)
    assert sorted(hosts) == ["node1", "node2", "node3"]
    for name, address in hosts.items():
        with ssh(address, bare_cluster.known_hosts, bare_cluster.key_file) as client:
            _, stdout, _ = client.exec_command("hostname && systemctl is-system-running --wait")
            lines = stdout.read().decode().split()
            assert stdout.channel.recv_exit_status() in (0, 1)
            assert lines[0] == name
            assert lines[1] in ("running", "degraded")


def test_nodes_start_without_the_apt_bindings_ansible_would_install_itself(bare_cluster):
    """As minimal images do: site.yml's first run must install python3-apt itself (playbooks/tasks/apt_bindings.yml)."""
    address = inventory_hosts(bare_cluster.inventory)["node1"]
    with ssh(address, bare_cluster.known_hosts, bare_cluster.key_file) as client:
        rc, out = run_on(client, "python3 -c 'import apt_pkg'")
    assert rc != 0 and "apt_pkg" in out


def test_nodes_have_their_own_host_keys(bare_cluster):
    keys = [
        line.split()[2]
        for line in Path(bare_cluster.known_hosts).read_text().splitlines()
        if line.split()[1] == "ssh-ed25519"
    ]
    assert len(keys) == 3 and len(set(keys)) == 3


def test_an_unknown_host_key_is_refused(bare_cluster, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        ssh(bare_cluster.nodes[0].address, str(empty), bare_cluster.key_file)


def test_password_login_is_off(bare_cluster):
    transport = paramiko.Transport((bare_cluster.nodes[0].address, 22))
    try:
        transport.start_client(timeout=10)
        with pytest.raises(paramiko.BadAuthenticationType) as excinfo:
            transport.auth_password("root", "root")
        assert "password" not in excinfo.value.allowed_types
    finally:
        transport.close()


def test_up_replaces_leftovers_of_an_earlier_run(bare_cluster):
    """A crashed run leaves containers and a network behind; the next `up` must not trip over them."""
    name = f"{bare_cluster.name}-leftover"
    label = f"{testcluster.LABEL}={name}"
    testcluster.docker("network", "create", "--label", label, "--subnet", "172.30.250.0/24", f"{name}-net")
    testcluster.docker("create", "--name", f"{name}-node1", "--label", label, bare_cluster.image)
    try:
        fresh = testcluster.up(1, name=name)
        with ssh(fresh.nodes[0].address, fresh.known_hosts, fresh.key_file) as client:
            _, stdout, _ = client.exec_command("hostname")
            assert stdout.read().decode().strip() == "node1"
    finally:
        testcluster.down(name)
    assert testcluster._resources(name) == ([], [])


def test_ubuntu_nodes_run_the_release_asked_for_reached_as_a_sudo_user(ubuntu_cluster):
    """Real Ubuntu root file systems (debootstrap from Ubuntu's archive), one per release, each reached as
    the login user with passwordless sudo; root accepts no key, as on a cloud image."""
    expected = {"node1": ("20.04", "focal"), "node2": ("22.04", "jammy"), "node3": ("24.04", "noble")}
    assert {n.name: n.os for n in ubuntu_cluster.nodes} == {
        "node1": "ubuntu20.04",
        "node2": "ubuntu22.04",
        "node3": "ubuntu24.04",
    }
    for node in ubuntu_cluster.nodes:
        with ssh(node.address, ubuntu_cluster.known_hosts, ubuntu_cluster.key_file, user="ops") as client:
            status, out = run_on(
                client, ". /etc/os-release && echo $ID $VERSION_ID $VERSION_CODENAME && whoami && sudo -n id -u"
            )
            assert status == 0, out
            assert out.split() == ["ubuntu", *expected[node.name], "ops", "0"]
        with pytest.raises(paramiko.AuthenticationException):
            ssh(node.address, ubuntu_cluster.known_hosts, ubuntu_cluster.key_file, user="root")


def test_ubuntu_nodes_install_from_the_archive_through_the_apt_cache(ubuntu_cluster):
    """apt on an Ubuntu node trusts the archive (signed by the key checked when the image was built) and
    fetches through the control machine's apt-cacher-ng."""
    assert ubuntu_cluster.apt_proxy.endswith(":3142")
    node = ubuntu_cluster.node("node2")
    with ssh(node.address, ubuntu_cluster.known_hosts, ubuntu_cluster.key_file, user="ops") as client:
        status, out = run_on(client, "apt-config dump Acquire::http::Proxy && sudo apt-get update 2>&1")
    assert status == 0, out
    assert ubuntu_cluster.apt_proxy in out
    assert "jammy-updates InRelease" in out and "NO_PUBKEY" not in out


def test_ubuntu_archive_key_is_trusted_only_with_its_fingerprint(tmp_path):
    """The keyring debootstrap verifies Ubuntu's Release files with holds the archive key with the published
    fingerprint and nothing else; a keyring without that key (Debian's) would not be taken."""
    keyring = nodeimages.ubuntu_keyring()
    assert nodeimages.fingerprints(keyring) == ["F6ECB3762474EDA9D21B7022871920D1991BC93C"]
    debian = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
    if debian.exists():
        assert nodeimages.UBUNTU_ARCHIVE_KEY not in nodeimages.fingerprints(debian)


def test_up_refuses_an_unknown_os_and_a_count_mismatch():
    with pytest.raises(testcluster.ClusterError, match=r"unknown OS 'ubuntu18\.04'"):
        testcluster.up(1, name="never", os_name="ubuntu18.04")
    with pytest.raises(testcluster.ClusterError, match=r"2 node\(s\) but 3 OS name"):
        testcluster.up(2, name="never", os_name=["focal", "jammy", "noble"])


def test_keyrings_are_read_without_the_users_gnupg_directory(tmp_path, monkeypatch):
    """The Ubuntu images build side by side, each reading the archive keyring's fingerprints: on a fresh machine
    gpg calls racing to create ~/.gnupg failed all but one build ("can't create directory ... File exists").
    Reading a keyring uses no ~/.gnupg at all: it works where none can be made."""
    keyring = nodeimages.ubuntu_keyring()
    home = tmp_path / "home"
    home.write_text("")  # a file: no ~/.gnupg can be created under it
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("GNUPGHOME", raising=False)
    with ThreadPoolExecutor(max_workers=4) as pool:
        found = list(pool.map(lambda _: nodeimages.fingerprints(keyring), range(4)))
    assert found == [[nodeimages.UBUNTU_ARCHIVE_KEY]] * 4


def port_in_use(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_the_apt_cache_is_started_once_when_asked_side_by_side(tmp_path, monkeypatch, capfd):
    """The session's background image builds and its first cluster ask for the apt cache at the same moment: one
    daemon starts, and both get its port."""
    if not nodeimages.shutil.which("apt-cacher-ng", path="/usr/sbin:/usr/local/sbin"):
        pytest.skip("apt-cacher-ng is not installed")
    port = next(p for p in range(3150, 3200) if not port_in_use(p))  # apt-cacher-ng refuses ephemeral ports
    monkeypatch.setattr(nodeimages, "APT_CACHE_PORT", port)
    monkeypatch.setattr(nodeimages, "CACHE_DIR", tmp_path)
    try:
        with ThreadPoolExecutor(max_workers=3) as pool:
            ports = list(pool.map(lambda _: nodeimages.ensure_apt_cache(), range(3)))
    finally:
        pid = tmp_path / "apt-cacher-ng" / "pid"
        if pid.exists():
            os.kill(int(pid.read_text().strip()), signal.SIGTERM)
    assert ports == [port] * 3
    assert capfd.readouterr().err.count("starting apt-cacher-ng") == 1


def test_an_image_build_that_cannot_start_leaves_no_work_directory(tmp_path, monkeypatch):
    """A build that fails before debootstrap runs (here the Ubuntu keyring cannot be had) leaves the images
    directory as it found it: no empty work directory per failed attempt."""
    if not nodeimages.shutil.which("debootstrap"):
        pytest.skip("debootstrap is not installed")

    def no_keyring():
        raise nodeimages.ClusterError("ubuntu-keyring could not be fetched")

    monkeypatch.setattr(nodeimages, "ubuntu_keyring", no_keyring)
    with pytest.raises(nodeimages.ClusterError, match="could not be fetched"):
        nodeimages.build_rootfs(tmp_path / "noble.tar", nodeimages.distro("ubuntu24.04"))
    assert list(tmp_path.iterdir()) == []


class StaleNetworkDocker:
    """`docker` as it answers for a network that holds an endpoint of a removed container (moby/moby#42119):
    `network rm` refuses with "has active endpoints", `network inspect` lists no container on it."""

    def __init__(self, stale: str, clock: list[float]):
        self.networks, self.stale, self.clock = {stale: "172.30.80.0/24"}, stale, clock

    def __call__(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        self.clock[0] += 0.2  # each docker call takes a while
        code, out, err = 0, "", ""
        if args[:2] == ("network", "rm"):
            if args[2] == self.stale:
                code, err = 1, f"Error response from daemon: network {args[2]} id 8a6f has active endpoints"
            else:
                self.networks.pop(args[2], None)
        elif args[:2] == ("network", "inspect"):
            code = 0 if args[-1] in self.networks else 1
        elif args[:2] == ("network", "ls"):
            out = "\n".join(self.networks)
        elif args[:2] == ("network", "create"):
            self.networks[args[-1]] = args[args.index("--subnet") + 1]
        return subprocess.CompletedProcess(args, code, out, err)


def test_a_network_docker_will_not_remove_is_left_named_and_the_next_cluster_takes_another_name(
    tmp_path, monkeypatch, capfd
):
    """After the 64-node cluster went, Docker refused to remove its network ("has active endpoints") listing no
    container on it, until dockerd restarted: `down` gives up on it within seconds and says so, and the next
    cluster of that name makes its network under another name instead of failing on the one left."""
    clock = [0.0]
    fake = StaleNetworkDocker("cc-big-net", clock)
    monkeypatch.setattr(testcluster, "docker", fake)
    monkeypatch.setattr(testcluster, "ensure_docker", lambda: None)
    monkeypatch.setattr(testcluster, "STATE_DIR", tmp_path)
    monkeypatch.setattr(testcluster, "_free_subnet", lambda: testcluster.ipaddress.ip_network("172.30.81.0/24"))
    fake_time = SimpleNamespace(
        monotonic=lambda: clock[0], sleep=lambda seconds: clock.__setitem__(0, clock[0] + seconds)
    )
    monkeypatch.setattr(testcluster, "time", fake_time)  # this module's clock only

    testcluster.down("cc-big")
    assert clock[0] < 15  # not the whole 30 s meant for endpoints Docker still lists
    said = capfd.readouterr().err
    assert "refuses to remove the network cc-big-net" in said and "moby/moby#42119" in said
    assert "restarting dockerd" in said

    name, subnet = testcluster._network("cc-big-net", "cc-big")
    assert name == "cc-big-net-2" and str(subnet) == "172.30.81.0/24"
    assert set(fake.networks) == {"cc-big-net", "cc-big-net-2"}
