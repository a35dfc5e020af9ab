"""cluster_hosts: NCCL and gloo use the cluster interface, in SSH sessions and login shells."""

import pytest

VARIABLES = ["NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"]


@pytest.mark.parametrize("variable", VARIABLES)
def test_socket_ifname_names_an_interface_with_an_address(host, variable):
    value = host.run(f"printenv {variable}").stdout.strip()  # SSH sessions read /etc/environment
    assert value, f"{variable} is not set in SSH sessions (/etc/environment)"
    assert host.interface(value).exists, f"{variable}={value}, but there is no such interface"
    assert host.interface(value, family="inet").addresses, f"{variable}={value} has no IPv4 address"
    login = host.run(f"bash -lc 'printenv {variable}'").stdout.strip()
    assert login == value, f"login shells set {variable}={login!r}, SSH sessions {value!r}"


def test_nccl_conf_names_the_same_interface(host):
    conf = host.file("/etc/nccl.conf")
    assert conf.exists
    value = host.run("printenv NCCL_SOCKET_IFNAME").stdout.strip()
    assert f"NCCL_SOCKET_IFNAME={value}" in conf.content_string.splitlines()
