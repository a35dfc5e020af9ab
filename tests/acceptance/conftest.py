"""Acceptance tests for a cluster set up with site.yml: run them against your own nodes, from this checkout with the
`test` extra installed and the environment activated (testinfra runs Ansible's `ansible-inventory` from PATH):

    .venv/bin/pip install -q -c constraints.txt -e '.[test]' && . .venv/bin/activate
    pytest tests/acceptance --hosts=ansible://gpu_nodes --ansible-inventory=inventory/hosts.ini [--junitxml=out.xml]

They check what the roles promise, through the same inventory Ansible used, and depend on
nothing from the project's own test fixtures. The plain `pytest` run does not collect them
(tests/conftest.py ignores this directory unless --hosts is given).
"""

from __future__ import annotations

import pytest
import testinfra
from testinfra.utils.ansible_runner import AnsibleRunner


def pytest_configure(config):
    """A usage error before anything runs (pytest's exit status 4), also in the test lanes' controller."""
    if not config.getoption("ansible_inventory", default=None):
        raise pytest.UsageError("the acceptance tests need --ansible-inventory=PATH (the inventory site.yml ran with)")


@pytest.fixture(scope="session")
def runner(request) -> AnsibleRunner:
    return AnsibleRunner(request.config.getoption("ansible_inventory"))


@pytest.fixture(scope="session")
def node_names(runner) -> list[str]:
    """Every node of the gpu_nodes group."""
    return sorted(runner.get_hosts("gpu_nodes"))


@pytest.fixture(scope="session")
def peers(runner, node_names):
    """A testinfra host for every node, to compare nodes with each other."""
    return {
        name: testinfra.get_host(f"ansible://{name}", ansible_inventory=runner.inventory_file) for name in node_names
    }
