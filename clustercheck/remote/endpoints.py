"""The TCP connections this process holds, from /proc (Linux, standard library): which local address a rank's
gloo or NCCL sockets really bound to, so the controller can name the interface the job used rather than the
one it asked for."""

from __future__ import annotations

import os
import socket
import struct

STATES = {"01": "established", "0A": "listen"}


def _address(text: str) -> str:
    """/proc/net/tcp's hex address (host byte order per 32-bit word) -> its text form."""
    raw = bytes.fromhex(text)
    words = b"".join(struct.pack("<I", struct.unpack(">I", raw[i : i + 4])[0]) for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(words) == 4 else socket.AF_INET6
    address = socket.inet_ntop(family, words)
    return address[7:] if address.startswith("::ffff:") and "." in address else address


def _own_sockets() -> set:
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    return inodes


def tcp_endpoints(limit: int = 256) -> list:
    """This process's established and listening TCP sockets: [{local, local_port, remote, remote_port, state}]."""
    try:
        mine = _own_sockets()
    except OSError:
        return []
    found = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as fh:
                lines = fh.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[9] not in mine or fields[3] not in STATES:
                continue
            local, local_port = fields[1].split(":")
            remote, remote_port = fields[2].split(":")
            found.append(
                {
                    "local": _address(local),
                    "local_port": int(local_port, 16),
                    "remote": _address(remote),
                    "remote_port": int(remote_port, 16),
                    "state": STATES[fields[3]],
                }
            )
    return found[:limit]
