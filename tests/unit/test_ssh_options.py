"""What Ansible passes to OpenSSH, read and honoured by clustercheck's SSH transport: the ssh arguments of the
inventory (ProxyCommand, -J with several hops, -i, -p, -l, -F), ssh_config's Match, and an option the transport
cannot honour refused in one line naming it and the node (exit 4), never met as a timeout."""

from __future__ import annotations

import builtins
import threading

import paramiko
import pytest

from clustercheck import hosts, inventory, sshoptions
from clustercheck.exitcodes import ExitCode, UsageError
from clustercheck.hosts import SshOptions
from clustercheck.inventory import Node, node_from_vars
from clustercheck.transport import TransportError
from clustercheck.transport.connection import Connection
from clustercheck.transport.params import ConnectParams, Timeouts, UnhonouredOption, read_config, resolve

# Ansible's FAQ, "How do I configure a jump host to access servers that I have no direct access to?"
# (docs.ansible.com, reference_appendices/faq.html), its two forms of a bastion in the inventory.
FAQ_PROXYCOMMAND = '-o ProxyCommand="ssh -W %h:%p -q user@gateway.example.com"'
FAQ_PROXYJUMP = "-J user@gateway.example.com"


def test_the_faq_proxycommand_is_run_with_its_tokens_as_openssh_substitutes_them():
    node = node_from_vars(
        "node2", {"ansible_host": "10.0.0.12", "ansible_user": "root", "ansible_ssh_common_args": FAQ_PROXYCOMMAND}
    )
    params = resolve(node, None)
    assert params.proxy_command.split() == ["ssh", "-W", "10.0.0.12:22", "-q", "user@gateway.example.com"]
    assert "ProxyCommand" in params.route and "gateway.example.com" in params.route


def test_proxycommand_tokens():
    command = resolve(
        Node("gpu7", "gpu7", port=2222, user="ops", ssh_options={"proxycommand": "nc -X 5 %h %p # %r %n 100%%"}),
        paramiko.SSHConfig.from_text("Host gpu7\n    HostName 10.1.0.7\n"),
    ).proxy_command
    assert command.split() == ["nc", "-X", "5", "10.1.0.7", "2222", "#", "ops", "gpu7", "100%"]
    with pytest.raises(UnhonouredOption, match=r"gpu7.*%C"):
        resolve(Node("gpu7", "gpu7", ssh_options={"proxycommand": "ssh -W %C bastion"}), None)


def test_ssh_flags_in_the_inventory_set_their_options_the_first_value_winning():
    args = sshoptions.parse_args("-qC -p2222 -l admin -i ~/.ssh/site -o User=second -F /etc/site/ssh_config")
    assert args.options["port"] == "2222"
    assert args.options["user"] == "admin"
    assert args.options["identityfile"] == "~/.ssh/site"
    assert args.config_file == "/etc/site/ssh_config"
    node = node_from_vars(
        "n1", {"ansible_ssh_common_args": "-o Port=2200", "ansible_ssh_extra_args": "-o Port=2201 -l extra"}
    )
    assert (node.ssh_options["port"], node.ssh_options["user"]) == ("2200", "extra")
    params = resolve(node, None)
    assert (params.port, params.user) == (2200, "extra")


def test_proxycommand_and_proxyjump_exclude_each_other_the_first_winning():
    args = sshoptions.parse_args(f"{FAQ_PROXYJUMP} {FAQ_PROXYCOMMAND}")
    assert "proxycommand" not in args.options and args.options["proxyjump"] == "user@gateway.example.com"
    config = paramiko.SSHConfig.from_text("Host *\n    ProxyJump cfgjump\n")
    params = resolve(Node("n1", "10.0.0.1", ssh_options={"proxycommand": "nc %h %p"}), config)
    assert params.proxy_command == "nc 10.0.0.1 22" and params.proxy_jump is None and params.jumps == []


TWO_HOPS = """
Host outer
    HostName 192.0.2.10
    User gate
    Port 2022
Host inner
    HostName 10.9.0.1
    IdentityFile /keys/inner
Host *
    UserKnownHostsFile /state/known_hosts
"""


def test_proxyjump_with_two_hops_resolves_each_hop_with_its_own_settings():
    node = node_from_vars("gpu01", {"ansible_host": "10.9.0.21", "ansible_ssh_common_args": "-J outer,root@inner"})
    params = resolve(node, paramiko.SSHConfig.from_text(TWO_HOPS))
    assert params.proxy_jump == "outer,root@inner"
    outer, inner = params.jumps
    assert (outer.hostname, outer.port, outer.user) == ("192.0.2.10", 2022, "gate")
    assert (inner.hostname, inner.port, inner.user, inner.key_files) == ("10.9.0.1", 22, "root", ["/keys/inner"])
    assert inner.user_known_hosts == ["/state/known_hosts"]
    assert params.route == " through ProxyJump outer,root@inner"
    everywhere = paramiko.SSHConfig.from_text("Host *\n    ProxyJump bastion\n")  # the hop too: not followed
    assert [hop.hostname for hop in resolve(Node("n", "n"), everywhere).jumps] == ["bastion"]
    uri = resolve(Node("n", "n", ssh_options={"proxyjump": "ssh://ops@[fe80::1]:2200"}), None)
    assert (uri.jumps[0].hostname, uri.jumps[0].port, uri.jumps[0].user) == ("fe80::1", 2200, "ops")


@pytest.mark.parametrize(
    ("args", "option"),
    [
        ("-o PKCS11Provider=/usr/lib/x86_64-linux-gnu/opensc-pkcs11.so", "PKCS11Provider"),
        ("-I /usr/lib/opensc-pkcs11.so", "PKCS11Provider"),
        ("-o GSSAPIAuthentication=yes -o PreferredAuthentications=gssapi-with-mic", "PreferredAuthentications"),
        ("-o PubkeyAuthentication=no", "PubkeyAuthentication"),
        ("-b 10.0.0.5", "BindAddress"),
        ("-o HostKeyAlias=gpu-frontend", "HostKeyAlias"),
        ("-o KnownHostsCommand='/usr/local/bin/keys %H'", "KnownHostsCommand"),
        ("-o NoSuchOption=1", "nosuchoption"),
    ],
)
def test_an_option_the_transport_cannot_honour_is_a_usage_error_naming_it_and_the_node(
    tmp_path, monkeypatch, args, option
):
    listing = {
        "_meta": {"hostvars": {"node2": {"ansible_host": "10.0.0.12", "ansible_ssh_common_args": args}}},
        "all": {"hosts": ["node2"]},
    }
    monkeypatch.setattr(inventory, "_ansible_inventory_list", lambda path: listing)  # ansible-inventory's JSON
    with pytest.raises(UsageError) as raised:
        hosts.load(str(_empty(tmp_path)), None, SshOptions(config=str(_empty(tmp_path))))
    assert raised.value.code == ExitCode.USAGE_ERROR
    message = str(raised.value)
    assert message.startswith("node2: ") and option in message and "inventory" in message
    assert "\n" not in message


def test_options_a_stock_config_sets_are_harmless(tmp_path):
    """Ubuntu's /etc/ssh/ssh_config sets GSSAPIAuthentication yes for every host, and Ansible's ssh_args carry
    ControlMaster and ControlPersist: a run goes on; the same config with PKCS11Provider for the host stops."""
    stock = "Host *\n    SendEnv LANG LC_*\n    HashKnownHosts yes\n    GSSAPIAuthentication yes\n"
    config = tmp_path / "ssh_config"
    config.write_text(stock)
    node = Node(
        "gpu01",
        "10.0.0.11",
        ssh_options=sshoptions.parse_args("-C -o ControlMaster=auto -o ControlPersist=60s").options,
    )
    assert resolve(node, read_config([str(config)])).hostname == "10.0.0.11"
    config.write_text(stock + "Host 10.0.0.11\n    PKCS11Provider /usr/lib/opensc-pkcs11.so\n")
    with pytest.raises(UnhonouredOption, match=r"gpu01: SSH option PKCS11Provider .*\(from the SSH config\)"):
        resolve(node, read_config([str(config)]))


def test_a_match_paramiko_cannot_evaluate_is_refused_naming_the_criterion(tmp_path, monkeypatch):
    config = tmp_path / "config"
    config.write_text("Match host gpu* localnetwork 10.0.0.0/8\n    ProxyJump bastion\n")
    with pytest.raises(UnhonouredOption, match=r"Match localnetwork"):
        read_config([str(config)])
    config.write_text("Match originalhost gpu* !user nobody-such\n    User ops\n")
    assert resolve(Node("gpu1", "gpu1"), read_config([str(config)])).user == "ops"
    config.write_text('Match exec "test -e /run/vpn"\n    ProxyJump bastion\n')
    real_import = builtins.__import__

    def no_invoke(name, *args, **kwargs):
        if name == "invoke":
            raise ImportError("No module named 'invoke'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_invoke)
    with pytest.raises(UnhonouredOption, match=r"Match exec needs Python's invoke"):
        read_config([str(config)])


def test_a_proxycommand_that_fails_is_named_with_its_status_and_its_words(tmp_path):
    """Not a timeout: the program's exit status and last line of stderr, as ssh's own `kex_exchange_identification`
    would leave a user guessing."""
    command = "sshh -W 192.0.2.1:22 bastion"  # a typo: the shell says the program is not found, status 127
    params = ConnectParams(
        hostname="192.0.2.1", port=22, user="root", proxy_command=command, user_known_hosts=[str(tmp_path / "kh")]
    )
    connection = Connection("node2", params, timeouts=Timeouts(connect=3, banner=3, auth=3))
    with pytest.raises(TransportError) as raised:
        connection.open()
    message = str(raised.value)
    assert message.startswith("node2 (192.0.2.1:22) through ProxyCommand")
    assert "exited with status 127" in message and "not found" in message
    assert "timed out" not in message


def _empty(tmp_path):
    path = tmp_path / "empty_ssh_config"
    path.write_text("")
    return path


def test_a_proxycommand_closed_by_two_threads_at_once_is_closed_once_and_says_nothing():
    """paramiko's transport thread closes its socket as the connection ends, and the connection's owner closes it
    at the same moment: the second close must find it closed (a clean-clone run printed 'Exception in thread':
    ValueError: seek of closed file), and the program is stopped either way."""
    from clustercheck.transport.connection import ProxyCommandSocket

    for _ in range(10):
        sock = ProxyCommandSocket("sleep 30")
        errors: list[BaseException] = []

        def close(sock=sock, errors=errors) -> None:
            try:
                sock.close()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=close) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert not errors, errors
        assert sock.process.poll() is not None and sock.stderr.closed
