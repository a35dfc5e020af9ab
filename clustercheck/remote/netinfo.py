"""What the network probe reads on its node (standard library only): who holds a TCP port (pid and command, from
/proc), the interface that carries an address and its MTU, and what a name resolves to."""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import subprocess

from .probing import run_of

SIOCGIFADDR = 0x8915


def listening_inodes(proc_net_tcp: str, port: int) -> set[str]:
    """Socket inodes listening on PORT, from the text of /proc/net/tcp or /proc/net/tcp6."""
    inodes = set()
    for line in proc_net_tcp.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        local, state, inode = fields[1], fields[3], fields[9]
        if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: TCP_LISTEN
            inodes.add(inode)
    return inodes


def port_holders(port: int, proc: str = "/proc") -> list[dict]:
    """The processes with a socket listening on PORT: [{pid, command, and for a clustercheck run's process
    "clustercheck": probing.run_of's}]; empty when none can be seen."""
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"{proc}/net/{table}") as fh:
                inodes |= listening_inodes(fh.read(), port)
        except OSError:
            continue
    if not inodes:
        return []
    targets = {f"socket:[{inode}]" for inode in inodes}
    holders = []
    for pid in sorted((p for p in os.listdir(proc) if p.isdigit()), key=int):
        try:
            fds = os.listdir(f"{proc}/{pid}/fd")
        except OSError:
            continue  # gone, or another user's process without root
        for fd in fds:
            try:
                if os.readlink(f"{proc}/{pid}/fd/{fd}") in targets:
                    with open(f"{proc}/{pid}/cmdline", "rb") as fh:
                        command = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
                    holder = {"pid": int(pid), "command": command}
                    job = run_of(pid, proc)
                    if job is not None:
                        holder["clustercheck"] = job  # another clustercheck run's process
                    holders.append(holder)
                    break
            except OSError:
                continue
    if not holders:
        holders.append({"pid": None, "command": "a process this user cannot see (run as root to name it)"})
    return holders


def interface_of(address: str) -> str | None:
    """The interface that carries ADDRESS (IPv4), or None."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            if socket.inet_ntoa(packed[20:24]) == address:
                return name
    finally:
        probe.close()
    # SIOCGIFADDR sees an interface's primary address only; `ip` also lists secondary ones.
    try:
        listing = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        listing = ""
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[3].split("/")[0] == address:
            return fields[1]
    return "lo" if address.startswith("127.") else None


def mtu_of(interface: str) -> int | None:
    try:
        with open(f"/sys/class/net/{interface}/mtu") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def resolve(name: str) -> dict:
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return {"hostname": name, "addresses": [], "error": str(exc)}
    addresses = []
    for info in infos:
        if info[4][0] not in addresses:
            addresses.append(info[4][0])
    return {"hostname": name, "addresses": addresses}
