"""base: packages and limits."""

import pytest

PACKAGES = ["build-essential", "dkms", "pciutils", "numactl", "chrony", "ufw"]


@pytest.mark.parametrize("name", PACKAGES)
def test_package_installed(host, name):
    assert host.package(name).is_installed, f"{name} is not installed"


def test_memlock_unlimited_in_ssh_sessions(host):
    assert host.check_output("bash -c 'ulimit -l'") == "unlimited"
