"""containers: Docker from the distribution, its networks clear of the cluster network, NVIDIA's Container Toolkit
registered with it on GPU nodes. Checked where the inventory sets containers_enabled: true."""

from __future__ import annotations

import ipaddress
import json

import pytest
from acceptance_helpers import setting

TRUE = ("true", "yes", "1")
TOOLKIT = (
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
)


@pytest.fixture
def containers(host, runner) -> dict:
    name = host.backend.get_hostname()
    if str(setting(runner, name, "containers_enabled", "containers")).lower() not in TRUE:
        pytest.skip("containers_enabled is not true in the inventory: the containers role is not applied")
    container = host.run("systemd-detect-virt --container").stdout.strip()
    return {
        "name": name,
        "daemon": json.loads(host.file("/etc/docker/daemon.json").content_string),
        "in_container": container not in ("", "none"),
        "variables": runner.get_variables(name),
    }


def _has_nvidia_gpu(host) -> bool:
    return host.run("grep -qs 0x10de /sys/bus/pci/devices/*/vendor").rc == 0


def test_docker_is_installed_and_running_where_a_daemon_can_run(host, runner, containers):
    package = setting(runner, containers["name"], "containers_docker_package", "containers")
    assert host.package(package).is_installed
    states = host.run("systemctl is-enabled docker.service docker.socket").stdout.split()
    if containers["in_container"]:  # an unprivileged container runs no Docker daemon: the role masks it
        assert states == ["masked", "masked"], states
        return
    assert host.service("docker").is_running and host.service("docker").is_enabled
    assert host.run("docker info --format '{{.ServerVersion}}'").rc == 0


def test_dockers_networks_stay_clear_of_the_cluster_network(host, containers):
    daemon = containers["daemon"]
    mine = [ipaddress.ip_network(p["base"]) for p in daemon.get("default-address-pools", [])]
    assert mine, "no default-address-pools in /etc/docker/daemon.json: Docker's own span 172.17.0.0/16-172.31.0.0/16"
    mine.append(ipaddress.ip_network(daemon["bip"], strict=False))
    # What Docker made already (docker0, user networks) counts too.
    routes = host.check_output("ip -4 -o route show").splitlines()
    mine += [
        ipaddress.ip_network(line.split()[0])
        for line in routes
        if " dev docker0 " in f" {line} " or " dev br-" in f" {line} "
    ]
    cluster = containers["variables"].get("cluster_cidr")
    assert cluster, "cluster_cidr is not set in the inventory"
    overlapping = [str(n) for n in mine if n.overlaps(ipaddress.ip_network(cluster, strict=False))]
    assert not overlapping, f"Docker's networks {overlapping} overlap the cluster network {cluster}"


def test_gpu_nodes_have_nvidias_runtime_pinned_and_registered(host, runner, containers):
    if not _has_nvidia_gpu(host):
        pytest.skip("no NVIDIA GPU on this node's PCI bus: no toolkit")
    version = setting(runner, containers["name"], "containers_toolkit_version", "containers")
    for name in TOOLKIT:
        assert host.package(name).version == version, f"{name} {host.package(name).version}, not {version}"
    held = set(host.check_output("apt-mark showhold").split())
    assert set(TOOLKIT) <= held, f"not held: {set(TOOLKIT) - held}"
    assert containers["daemon"]["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"
    if not containers["in_container"]:
        assert "nvidia" in json.loads(host.check_output("docker info --format '{{json .Runtimes}}'"))
