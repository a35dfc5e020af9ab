"""How known_hosts files are read: each once into an index by host name, the node's own keys looked up there, with
OpenSSH's own files (host keys made by ssh-keygen, entries hashed by `ssh-keygen -H`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import paramiko
import pytest

from clustercheck.transport import TransportError, hostkeys
from clustercheck.transport.params import ConnectParams


def host_key(directory: Path, name: str, kind: str = "ed25519") -> str:
    """`TYPE BASE64` of a fresh host key made by ssh-keygen."""
    path = directory / name
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)], check=True)
    return " ".join((path.with_suffix(".pub")).read_text().split()[:2])


@pytest.fixture
def keys(tmp_path) -> dict[str, str]:
    return {name: host_key(tmp_path, name) for name in ("one", "two", "other")} | {
        "one-ecdsa": host_key(tmp_path, "one-ecdsa", "ecdsa")
    }


def known_hosts(path: Path, lines: list[str], hashed: bool = False) -> str:
    path.write_text("".join(line + "\n" for line in lines))
    if hashed:
        subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(path)], check=True, capture_output=True)
        assert "|1|" in path.read_text() and "node1" not in path.read_text()
    return str(path)


@pytest.mark.parametrize("hashed", [False, True], ids=["plain", "hashed"])
def test_a_node_s_keys_are_found_by_name_address_and_port(tmp_path, keys, hashed):
    path = known_hosts(
        tmp_path / "known_hosts",
        [
            f"node1,10.0.0.1 {keys['one']}",
            f"node1,10.0.0.1 {keys['one-ecdsa']}",
            f"[node2]:2222 {keys['two']}",
            f"node3 {keys['other']}",
        ],
        hashed,
    )
    assert hostkeys.keys_for([path], "10.0.0.1") == [tuple(keys["one"].split()), tuple(keys["one-ecdsa"].split())]
    assert hostkeys.keys_for([path], "[node2]:2222") == [tuple(keys["two"].split())]
    assert hostkeys.keys_for([path], "node2") == []  # on port 22 it is another host
    assert hostkeys.keys_for([path], "node4") == []


def test_comments_markers_and_short_lines_name_no_key(tmp_path, keys):
    path = known_hosts(
        tmp_path / "known_hosts",
        [
            "# node1 " + keys["other"],
            f"@revoked node1 {keys['other']}",
            f"@cert-authority node1 {keys['other']}",
            "node1 ssh-ed25519",
            "",
            f"node1 {keys['one']} a comment",
        ],
    )
    assert hostkeys.keys_for([path], "node1") == [tuple(keys["one"].split())]


def test_a_key_recorded_in_the_file_during_the_run_is_found(tmp_path, keys):
    path = tmp_path / "known_hosts"
    known_hosts(path, [f"node1 {keys['one']}"])
    assert hostkeys.keys_for([str(path)], "node2") == []
    with open(path, "a") as fh:  # as --accept-new-host-keys records a key
        fh.write(f"node2 {keys['two']}\n")
    assert hostkeys.keys_for([str(path)], "node2") == [tuple(keys["two"].split())]


def test_the_client_gets_the_global_file_s_keys_first_else_the_user_s(tmp_path, keys):
    user = known_hosts(tmp_path / "user", [f"node1 {keys['one']}", f"node2 {keys['two']}"])
    system = known_hosts(tmp_path / "system", [f"node1 {keys['other']}"])
    for node, expected in (("node1", keys["other"]), ("node2", keys["two"])):
        client = paramiko.SSHClient()
        hostkeys.load(client, ConnectParams(node, user_known_hosts=[user], global_known_hosts=[system]))
        found = client.get_host_keys().lookup(node)
        assert found is not None
        assert [f"{k.get_name()} {k.get_base64()}" for k in found.values()] == [expected]


def test_a_known_hosts_path_that_cannot_be_read_is_one_line_naming_it(tmp_path):
    (tmp_path / "known_hosts").mkdir()
    with pytest.raises(TransportError, match=r"cannot read known_hosts file .*known_hosts: Is a directory"):
        hostkeys.keys_for([str(tmp_path / "known_hosts")], "node1")
    assert hostkeys.keys_for([str(tmp_path / "missing")], "node1") == []


def test_a_private_key_is_read_once_per_run_and_left_to_paramiko_when_it_cannot_be_read_here(tmp_path):
    from clustercheck.transport import connection as ssh

    for kind in ("ed25519", "rsa", "ecdsa"):
        path = tmp_path / f"id_{kind}"
        subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)], check=True)
        key = ssh._private_key(str(path))
        assert key is not None and key.get_base64() == (tmp_path / f"id_{kind}.pub").read_text().split()[1]
        assert ssh._private_key(str(path)) is key  # the same object: not read again
    # A key with a passphrase, a key with a certificate beside it, a file that is not there: paramiko reads them
    # (and asks for the passphrase, loads the certificate, or says what is missing) as it always did.
    locked = tmp_path / "id_locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(locked)], check=True)
    assert ssh._private_key(str(locked)) is None
    (tmp_path / "id_ed25519-cert.pub").write_text("ssh-ed25519-cert-v01@openssh.com AAAA\n")
    assert ssh._private_key(str(tmp_path / "id_ed25519")) is None
    assert ssh._private_key(str(tmp_path / "absent")) is None
