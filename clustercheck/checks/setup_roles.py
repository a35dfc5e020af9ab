"""From a check that found something wrong to the command that puts it right: which role of site.yml (its tag)
sets what each check checks, in one mapping (a test keeps it in step with site.yml's tags and the registry).

A WARN, FAIL or ERROR of a mapped check on a node gains `ansible-playbook site.yml -i INVENTORY --limit NODE --tags
ROLE` (the inventory as given to --hosts), in its remediation and as data (`fix_command` in the JSON report), so
a user's automation can run it. A cross-node check names the nodes that differ; one over the files of several roles
(consistency.files) names each difference's role in its data, and the line re-runs those roles.
"""

from __future__ import annotations

import shlex
from typing import Any

from clustercheck.checks.registry import with_fix_command
from clustercheck.model import CheckResult, Status

ROLE_OF = {  # check -> the role (and tag) of site.yml that sets what it checks
    "python.env": "python_env",
    "torch.import": "python_env",
    "torch.cuda": "python_env",
    "consistency.torch": "python_env",
    "consistency.cuda": "python_env",
    "consistency.nccl": "python_env",
    "consistency.python": "python_env",
    "consistency.packages": "python_env",
    "env.launch": "cluster_hosts",
    "hostname.resolve": "cluster_hosts",
    "network.resolve": "cluster_hosts",
    "gpu.driver": "nvidia_driver",
    "gpu.persistence": "nvidia_driver",
    "gpu.fabricmanager": "nvidia_driver",
    "consistency.driver": "nvidia_driver",
    "shm.size": "base",
    "ulimit.memlock": "base",
    "time.sync": "base",
    "neighbour.table": "base",
    "firewall": "firewall",
    "network.tcp": "firewall",
}
# Reported by the node that connected; the role's setting is on the node it connects to, unless the finding is the
# connecting node's own (its data's "side": "source": its rule drops the replies to its connections).
RECEIVER = {"network.tcp"}
PROBLEMS = (Status.WARN, Status.FAIL, Status.ERROR)


def nodes_of(result: CheckResult) -> list[str]:
    """The nodes RESULT finds wrong: its host (for a connection, the node connected to), or for a cross-node check
    the nodes its data says differ."""
    if result.name in RECEIVER:
        side = "from" if result.data.get("side") == "source" else "to"
        return [result.data[side]] if isinstance(result.data.get(side), str) else []
    if result.host is not None:
        return [result.host]
    nodes: list[str] = []
    for entry in result.data.get("differ") or []:
        named: Any = entry.get("nodes", {}) if isinstance(entry, dict) else [entry]
        nodes += [n for n in named if isinstance(n, str) and n not in nodes]
    return sorted(nodes)


def roles_of(result: CheckResult) -> list[str]:
    """The roles that set what RESULT checks: its check's (ROLE_OF), or for a check over the files of several roles
    (consistency.files) the role each difference in its data names."""
    if result.name in ROLE_OF:
        return [ROLE_OF[result.name]]
    entries = result.data.get("differ") or []
    return sorted({e["role"] for e in entries if isinstance(e, dict) and isinstance(e.get("role"), str) and e["role"]})


def fix_command(result: CheckResult, inventory: str) -> str | None:
    """The site.yml line that puts RESULT right on the nodes it names; None for a check no role sets, a PASS or
    SKIP, or a finding that names no node."""
    roles = roles_of(result)
    nodes = nodes_of(result)
    if not roles or result.status not in PROBLEMS or not nodes:
        return None
    tags = ",".join(roles)
    return shlex.join(["ansible-playbook", "site.yml", "-i", inventory, "--limit", ",".join(nodes), "--tags", tags])


def with_fix_commands(results: list[CheckResult], inventory: str | None) -> list[CheckResult]:
    """RESULTS, each mapped problem with its fix command (none without an inventory: a host list or localhost
    is no inventory for ansible-playbook)."""
    if inventory is None:
        return results
    out = []
    for result in results:
        command = fix_command(result, inventory)
        out.append(result if command is None else with_fix_command(result, command))
    return out
