"""base: packages and limits."""

import pytest

PACKAGES = ["build-essential", "dkms", "pciutils", "numactl", "chrony", "ufw"]


@pytest.mark.parametrize("name", PACKAGES)
def test_package_installed(host, name):
    assert host.package(name).is_installed, f"{name} is not installed"


def test_memlock_unlimited_in_ssh_sessions(host):
    container = host.run("systemd-detect-virt --container").stdout.strip()
    if container and container != "none":
        pytest.skip(f"{container} container: the runtime's hard memlock limit applies (docker run --ulimit memlock=-1)")
    assert host.check_output("bash -c 'ulimit -l'") == "unlimited", (
        "memlock is limited: RDMA and pinned memory need unlimited"
    )
