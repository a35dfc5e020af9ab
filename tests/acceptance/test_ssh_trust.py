"""ssh_trust: every node reaches every other node over SSH, host keys checked, no password."""


def test_ssh_to_every_node(host, node_names):
    for name in node_names:
        result = host.run(f"ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -o ConnectTimeout=10 {name} hostname")
        assert result.rc == 0, f"ssh {name} failed on {host.backend.get_hostname()}: {result.stderr.strip()}"
