"""ssh_trust: every node reaches every other node over SSH, as the trusted user, host keys checked, no password."""

import shlex


def _trusted_user(runner, host_name: str) -> str:
    """ssh_trust_user as the inventory sets it, else the role's default: the user Ansible logs in as."""
    variables = runner.get_variables(host_name)
    return variables.get("ssh_trust_user") or variables.get("ansible_user") or "root"


def test_ssh_to_every_node(host, runner, node_names):
    me = host.backend.get_hostname()
    user = _trusted_user(runner, me)
    for name in node_names:
        ssh = f"ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -o ConnectTimeout=10 {name} hostname"
        # the suite may run as root (become): log in from node to node as the user the role trusted
        command = ssh if user == "root" else f"sudo -n -H -u {shlex.quote(user)} {ssh}"
        result = host.run(command)
        assert result.rc == 0, f"ssh {name} as {user} failed on {me}: {result.stderr.strip()}"
