"""Parse what the facts collector (remote/facts.py) gathered on a node. Pure logic, no I/O. nvidia-smi's output is
parsed in facts/smi.py, the first command's in facts/firstcommand.py.

Every parser takes raw text (recorded outputs in the tests) and returns plain
values; what could not be collected stays None, with the reason kept.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from clustercheck.facts.xidlog import logged_at

XID_RE = re.compile(r"NVRM: Xid \((?P<pci>[^)\n]*)\): (?P<xid>\d+)")


def _matching_lines(text: str, pattern: re.Pattern[str]) -> list[tuple[re.Match[str], str]]:
    """Each line of TEXT that PATTERN matches (within the line), with its first match: one search through the whole
    text rather than one per line, since a kernel log holds thousands of lines and a few of them matter."""
    found: list[tuple[re.Match[str], str]] = []
    end = -1
    for match in pattern.finditer(text):
        if match.start() < end:
            continue  # a second match on a line already taken
        start = text.rfind("\n", 0, match.start()) + 1
        end = text.find("\n", match.end())
        end = len(text) if end < 0 else end
        found.append((match, text[start:end].strip()))
    return found


def parse_xids(kernel_log: str) -> list[dict[str, Any]]:
    """NVRM Xid lines of the kernel log -> [{pci, xid, line, at (where in the log), time (as the log wrote it)}]."""
    return [
        {"pci": match["pci"], "xid": int(match["xid"]), "line": line, "at": match.start(), "time": logged_at(line)}
        for match, line in _matching_lines(kernel_log, XID_RE)
    ]


# The kernel's message when its neighbour table is full: "neighbour: arp_cache: neighbor table overflow!" (5.x and
# later; ndisc_cache for IPv6), "Neighbour table overflow." (2.x).
# Without its first letter (n or N) and without IGNORECASE: a pattern that starts with a literal is searched for ten
# times faster through a 130 kB log, once per node.
NEIGH_OVERFLOW_RE = re.compile(r"eighbou?r table overflow")


def neighbour_overflows(kernel_log: str) -> list[str]:
    """The kernel log's "neighbor table overflow" lines."""
    return [line for _, line in _matching_lines(kernel_log, NEIGH_OVERFLOW_RE)]


def parse_timedatectl(text: str) -> dict[str, str]:
    """`timedatectl show -p ...` -> {NTPSynchronized: yes, NTP: yes, ...}."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def parse_chronyc_tracking(text: str) -> dict[str, Any]:
    """`chronyc -n tracking` -> leap status and the system clock's offset from NTP time, in seconds."""
    info: dict[str, Any] = {}
    for line in text.splitlines():
        key, _, value = (p.strip() for p in line.partition(":"))
        if key == "Leap status":
            info["leap_status"] = value
        elif key == "System time":
            match = re.match(r"([\d.]+) seconds (fast|slow)", value)
            if match:
                offset = float(match[1])
                info["offset_s"] = offset if match[2] == "fast" else -offset
        elif key == "Reference ID":
            info["reference"] = value
    return info


def parse_ip_addr(text: str) -> list[dict[str, Any]]:
    """`ip -o addr show` -> [{iface, address (an ip_interface)}]."""
    entries = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 4 and words[2] in ("inet", "inet6"):
            try:
                entries.append({"iface": words[1].split("@")[0], "address": ipaddress.ip_interface(words[3])})
            except ValueError:
                continue
    return entries


def pick_interface(
    addresses: list[dict[str, Any]],
    route_text: str,
    named: str | None,
    cidr: str | None,
    address: str | None,
) -> tuple[str | None, str]:
    """The interface nodes talk to each other on, and how it was found."""
    if named:
        return named, "cluster_interface"
    if cidr:
        try:
            network = ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            network = None
        for entry in addresses:
            if network is not None and entry["address"].ip in network:
                return entry["iface"], f"address in cluster_cidr {cidr}"
    if address:
        for entry in addresses:
            if str(entry["address"].ip) == address:
                return entry["iface"], f"holds {address}"
    match = re.search(r"\bdev (\S+)", route_text)
    if match:
        return match[1], "default route"
    return None, "not found"


def firewall_state(ufw: dict[str, Any], nft: dict[str, Any], iptables: dict[str, Any]) -> dict[str, Any]:
    """Whether incoming traffic is filtered, and by what, from `ufw status`, `nft list ruleset` and `iptables -S`
    (each may be missing): read in facts/firewall.py, which walks the input hook's rules."""
    from clustercheck.facts import firewall

    return firewall.firewall_state(ufw, nft, iptables)


ENV_LINE = re.compile(r"^\s*(?:export\s+)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*?)\s*$")
LAUNCH_PREFIXES = ("NCCL_", "GLOO_")


def parse_env_settings(text: str, prefixes: tuple[str, ...] = LAUNCH_PREFIXES) -> list[tuple[str, str, int]]:
    """NAME=VALUE assignments (optionally `export`ed, as in /etc/environment, /etc/profile.d/*.sh and
    /etc/nccl.conf) whose name starts with one of PREFIXES -> [(name, value, line number)]; quotes removed."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        match = ENV_LINE.match(line.split(" #")[0] if not line.lstrip().startswith("#") else "")
        if not match or not match["name"].startswith(prefixes):
            continue
        value = match["value"].rstrip(";")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        found.append((match["name"], value, number))
    return found


def parse_ifname_list(value: str) -> tuple[bool, bool, list[str]]:
    """NCCL_SOCKET_IFNAME's syntax: a comma-separated list of prefixes; `^` excludes them, `=` matches names
    exactly. -> (exclude, exact, names)."""
    value = value.strip()
    exclude = value.startswith("^")
    value = value.lstrip("^")
    exact = value.startswith("=")
    value = value.lstrip("=")
    return exclude, exact, [n.strip() for n in value.split(",") if n.strip()]


def iommu_mode(cmdline: str) -> str:
    """The IOMMU setting the kernel was booted with: 'passthrough' (iommu=pt or iommu.passthrough=1), 'off',
    'translated' (intel_iommu=on / amd_iommu=on without pt: DMA remapping that slows or breaks GPU peer-to-peer),
    or 'default' (nothing said: the distribution kernel's default)."""
    words = cmdline.split()
    values = {}
    for word in words:
        key, _, value = word.partition("=")
        values[key] = value
    if values.get("iommu") == "pt" or values.get("iommu.passthrough") == "1":
        return "passthrough"
    if values.get("iommu") == "off" or values.get("intel_iommu") == "off" or values.get("amd_iommu") == "off":
        return "off"
    if values.get("intel_iommu") == "on" or values.get("amd_iommu") == "on" or values.get("iommu") == "force":
        return "translated"
    return "default"


NVLINK_GPU = re.compile(r"^GPU (?P<index>\d+): (?P<name>.*?)(?: \(UUID: (?P<uuid>[^)]*)\))?\s*$")
NVLINK_LINK = re.compile(r"^\s+Link (?P<link>\d+): (?P<state>.*?)\s*$")
NVLINK_COUNTER = re.compile(r"^\s+Link (?P<link>\d+): (?P<counter>[A-Za-z][A-Za-z ]*?): (?P<value>\d+)\s*$")


def _nvlink_per_gpu(text: str, line_pattern: re.Pattern, add) -> dict[str, dict[str, Any]]:
    """An `nvidia-smi nvlink` listing -> {GPU index: {name, uuid, links}}, ADD(links, match) taking each line of
    LINE_PATTERN under a GPU; other lines (blank, an elision) are passed over."""
    gpus: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        if match := NVLINK_GPU.match(line):
            current = {"name": match["name"], "uuid": match["uuid"], "links": {}}
            gpus[match["index"]] = current
        elif (match := line_pattern.match(line)) and current is not None:
            add(current["links"], match)
    return gpus


def parse_nvlink_status(text: str) -> dict[str, dict[str, Any]]:
    """`nvidia-smi nvlink -s` -> {GPU index: {name, uuid, links: {link: "25.781 GB/s" or None when inactive}}}."""

    def add(links: dict, match: re.Match) -> None:
        links[match["link"]] = None if "inactive" in match["state"].lower() else match["state"]

    return _nvlink_per_gpu(text, NVLINK_LINK, add)


def parse_nvlink_errors(text: str) -> dict[str, dict[str, Any]]:
    """`nvidia-smi nvlink -e` -> {GPU index: {name, uuid, links: {link: {"Replay Errors": 0, ...}}}}."""

    def add(links: dict, match: re.Match) -> None:
        links.setdefault(match["link"], {})[match["counter"]] = int(match["value"])

    return _nvlink_per_gpu(text, NVLINK_COUNTER, add)


ACS_FLAGS = ("SrcValid", "TransBlk", "ReqRedir", "CmpltRedir", "UpstreamFwd", "EgressCtrl", "DirectTrans")


def parse_acs_control(lspci_vvv: str) -> dict[str, bool] | str | None:
    """The ACSCtl line of one device's `lspci -vvv` -> {flag: on}; None when the device has no ACS capability;
    "access denied" when lspci could not read the extended capabilities (it needs root for them)."""
    for line in lspci_vvv.splitlines():
        if "ACSCtl:" in line:
            flags = {}
            for word in line.split("ACSCtl:", 1)[1].split():
                name, sign = word[:-1], word[-1:]
                if name in ACS_FLAGS and sign in "+-":
                    flags[name] = sign == "+"
            return flags
    if "<access denied>" in lspci_vvv:
        return "access denied"
    return None


DCGM_ROW = re.compile(r"^\|\s*(?P<name>[^|]*?)\s*\|\s*(?P<value>[^|]*?)\s*\|$")
DCGM_SECTION = re.compile(r"^[|+]-+\s+(?P<section>[A-Za-z][\w ]*?)\s+-+")


def parse_dcgmi_diag(text: str) -> dict[str, Any]:
    """`dcgmi diag -r N` (its table) -> {metadata: {...}, tests: [{section, test, result, info}]}; an "Info"
    or "Warning" row, and the rows that continue it, go to the test above them."""
    metadata: dict[str, str] = {}
    tests: list[dict[str, Any]] = []
    section = None
    last_key = None
    for line in text.splitlines():
        if match := DCGM_SECTION.match(line):
            section = match["section"]
            continue
        match = DCGM_ROW.match(line)
        if not match or section is None:
            continue
        name, value = match["name"], match["value"]
        if section == "Metadata":
            if name:
                metadata[name] = value
                last_key = name
            elif last_key:
                metadata[last_key] += value
            continue
        if name in ("Info", "Warning") or (not name and tests):
            if tests:
                tests[-1]["info"] = (tests[-1].get("info", "") + value) if name == "" else value
            continue
        if name:
            tests.append({"section": section, "test": name, "result": value})
    return {"metadata": metadata, "tests": tests}


from clustercheck.facts.firstcommand import Identity as Identity  # noqa: E402 (re-exported: run/pipeline.py names it)
