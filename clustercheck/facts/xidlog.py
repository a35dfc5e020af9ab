"""From when an Xid of the kernel log counts: the lines that mark the NVIDIA driver's load and a GPU's reset, and the
time each line was logged. Pure; the collector's Xid probe (remote/facts.py xid_lines) sends these lines beside
the Xid lines, gpu.xid (checks/xid.py) judges by them.

- The driver's load: "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024"
  (akash-network/support issue 244), "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  530.41.03  Release
  Build ..." (NVIDIA/open-gpu-kernel-modules issue 489). A driver loaded again (modprobe -r nvidia ...; modprobe
  nvidia) initialises every GPU anew.
- A GPU's reset: no kernel line that marks `nvidia-smi -r` was found in public logs, and NVIDIA's NVSentinel writes
  its own ("GPU reset acknowledgements are emitted through logger rather than the kernel", its syslog monitor,
  pull request 1475). Its reset job logs
  `logger -t nvsentinel-gpu-reset "GPU reset executed: ${UUID}, success: ${SYSLOG_SUCCESS}"` (its gpu-reset script),
  e.g. "GPU reset executed: GPU-455d8f70-2051-db6c-0430-ffc457bff834, success: true" (NVSentinel's
  health-monitors/syslog-health-monitor/pkg/xid/xid_handler.go); such a line, by whoever wrote it, marks that GPU's
  reset. It names the GPU's UUID; the driver's "NVRM: GPU at PCI:0000:00:05: GPU-efbdfde9-..." line (which the
  driver writes with a GPU's Xids) and nvidia-smi -q give its PCI address.
"""

from __future__ import annotations

import re
from typing import Any

LOAD_RE = re.compile(r"NVRM: loading NVIDIA UNIX .*?Kernel Module(?: for \S+)?\s+(?P<version>\d+(?:\.\d+)+)")
GPU_AT_RE = re.compile(r"NVRM: GPU at (?P<pci>PCI:[0-9A-Fa-f:.]+): (?P<uuid>GPU-[0-9A-Fa-f-]+)")
RESET_RE = re.compile(r"GPU reset executed: (?P<uuid>GPU-[0-9A-Fa-f-]+), success: true")

_DMESG_CTIME = re.compile(r"^\[(?P<time>[^\]]*[A-Za-z][^\]]*)\]")  # dmesg -T: "[Fri Aug  9 13:32:56 2024]"
_DMESG_RAW = re.compile(r"^\[\s*(?P<seconds>\d+\.\d+)\]")  # dmesg: "[  409.775718]"
# journalctl -o short-iso's "2026-06-01T15:55:06.218036+03:00", a journal's or syslog's "Jun 01 17:12:22"
_STAMP = re.compile(r"^(?:\d{4}-\d{2}-\d{2}T\S+|\S{3}\s+\d{1,2} \d{2}:\d{2}:\d{2}(?:\.\d+)?)")
_ISO_ANYWHERE = re.compile(r"\[(\d{4}-\d{2}-\d{2}T[^\]]+)\]")  # a remote log's "host: kern: warning: [2026-...Z]:"


def logged_at(line: str) -> str | None:
    """When LINE was logged, as the log wrote it: journalctl -o short-iso's "2026-06-01T15:55:06+0300", a journal's
    or syslog's "Dec  2 10:43:35", dmesg -T's "Fri Aug  9 13:32:56 2024", plain dmesg's "409.775718 s after boot";
    None where the line carries no time."""
    text = line.strip()
    if match := _DMESG_RAW.match(text):
        return f"{match['seconds']} s after boot"
    if match := _DMESG_CTIME.match(text):
        return " ".join(match["time"].split())
    if match := _STAMP.match(text):
        return match[0]
    match = _ISO_ANYWHERE.search(text[: max(text.find("NVRM:"), 0)])
    return match[1] if match else None


def pci_key(bus: str) -> str:
    """A GPU's PCI address as the driver's Xid lines write it, "PCI:0000:2b:00", from that form or nvidia-smi's
    "00000000:2B:00.0"."""
    text = bus.strip().removeprefix("PCI:").split(".")[0].lower()
    parts = text.split(":")
    if len(parts) == 3:
        parts[0] = parts[0][-4:].rjust(4, "0")
    return "PCI:" + ":".join(parts)


def driver_loads(kernel_log: str) -> list[dict[str, Any]]:
    """The driver's load lines, oldest first: [{at (where in the log), time, version, line}]."""
    return [
        {"at": match.start(), "time": logged_at(line), "version": match["version"], "line": line}
        for match, line in _lines(kernel_log, LOAD_RE)
    ]


def gpu_resets(kernel_log: str, uuids: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Each GPU's last reset the log marks: {pci_key: {at, time, uuid, line}}; the GPU's UUID found in the log's
    "GPU at PCI" lines, else in UUIDS ({uuid: bus id}, from nvidia-smi -q). A reset of a GPU neither names is kept
    under its UUID."""
    known = {uuid.lower(): pci_key(bus) for uuid, bus in (uuids or {}).items()}
    known.update({m["uuid"].lower(): pci_key(m["pci"]) for m, _ in _lines(kernel_log, GPU_AT_RE)})
    resets: dict[str, dict[str, Any]] = {}
    for match, line in _lines(kernel_log, RESET_RE):
        uuid = match["uuid"]
        mark = {"at": match.start(), "time": logged_at(line), "uuid": uuid, "line": line}
        resets[known.get(uuid.lower(), uuid)] = mark
    return resets


def _lines(text: str, pattern: re.Pattern[str]) -> list[tuple[re.Match[str], str]]:
    """Each line of TEXT that PATTERN matches, with the match."""
    found = []
    for match in pattern.finditer(text):
        start = text.rfind("\n", 0, match.start()) + 1
        end = text.find("\n", match.end())
        found.append((match, text[start : len(text) if end < 0 else end].strip()))
    return found
