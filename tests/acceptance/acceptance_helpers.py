"""Helpers shared by the acceptance tests (pure look-ups; no test fixtures of the project)."""

from __future__ import annotations

import ipaddress
from functools import cache
from pathlib import Path

import yaml

ROLES = Path(__file__).resolve().parent.parent.parent / "roles"


@cache
def _role_default(role: str, name: str):
    return yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text())[name]


def setting(runner, host_name: str, variable: str, role: str, default_name: str | None = None):
    """A variable as the inventory sets it for HOST, else the role's default."""
    value = runner.get_variables(host_name).get(variable)
    if value is None:
        value = _role_default(role, default_name or variable)
    return value


def addresses_of(host) -> set[str]:
    """The IPv4 addresses of a node."""
    out = host.check_output("ip -4 -o addr show")
    return {line.split()[3].split("/")[0] for line in out.splitlines()}


def is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback
