"""A process's TCP sockets as the kernel lists them in /proc/<pid>/net/tcp and tcp6 (pure parsing; the rows are
read on the node by remote/heartbeats.py, kept only where their inode is one of the process's own sockets).

proc_net_tcp(5) (man7.org, "/proc/net/tcp"): each row is `sl local_address rem_address st tx_queue:rx_queue
tr:tm->when retrnsmt uid timeout inode ...`; an address is the IP in hexadecimal and the port in hexadecimal after a
colon; the IP is the kernel's 32-bit words printed as numbers, so on a little-endian machine (x86-64, arm64) each
word's bytes come reversed ("0100007F" is 127.0.0.1). `st` is the TCP state (include/net/tcp_states.h: 01
ESTABLISHED, 02 SYN_SENT, 0A LISTEN, ...).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

STATES = {
    "01": "ESTABLISHED",
    "02": "SYN_SENT",
    "03": "SYN_RECV",
    "04": "FIN_WAIT1",
    "05": "FIN_WAIT2",
    "06": "TIME_WAIT",
    "07": "CLOSE",
    "08": "CLOSE_WAIT",
    "09": "LAST_ACK",
    "0A": "LISTEN",
    "0B": "CLOSING",
}


@dataclass(frozen=True)
class Socket:
    local: str  # the local address
    local_port: int
    remote: str
    remote_port: int
    state: str  # ESTABLISHED, SYN_SENT, LISTEN, ...
    inode: int


def address(field: str) -> tuple[str, int]:
    """A row's address, "0100007F:0CEA" -> ("127.0.0.1", 3306); an IPv6 address is 32 hexadecimal digits, an
    IPv4-mapped one is given as its IPv4 address. ValueError for anything else."""
    ip, _, port = field.partition(":")
    if len(ip) not in (8, 32) or not port:
        raise ValueError(f"not an address of /proc/net/tcp: {field!r}")
    # each 32-bit word as the little-endian machine stores it
    raw = b"".join(bytes.fromhex(ip[i : i + 8])[::-1] for i in range(0, len(ip), 8))
    parsed = ipaddress.ip_address(raw)
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped:
        parsed = parsed.ipv4_mapped
    return str(parsed), int(port, 16)


def parse_row(row: str) -> Socket | None:
    """One row of /proc/<pid>/net/tcp or tcp6 (the heading, or a row cut short: None)."""
    fields = row.split()
    if len(fields) < 10 or not fields[0].endswith(":"):
        return None
    try:
        local, local_port = address(fields[1])
        remote, remote_port = address(fields[2])
        return Socket(local, local_port, remote, remote_port, STATES.get(fields[3].upper(), fields[3]), int(fields[9]))
    except ValueError:
        return None


def parse_rows(rows: list[str]) -> list[Socket]:
    return [s for s in (parse_row(r) for r in rows) if s is not None]
