"""Every rank's last heartbeat on a node (standard library only, Python 3.8+; the controller sends this file with
`python -c`: stages/launch.py's progress_command).

argv: OUT, the stage's output directory, then --sockets to add each rank's TCP sockets. Prints one JSON object,
each rank's heartbeat by its number (OUT/heartbeat/rank-N.json: step, phase, pid) with its age in seconds, measured
on the node's own clock; a heartbeat being written or gone is left out. With --sockets, each rank's "tcp": the rows
of /proc/<pid>/net/tcp and tcp6 (raw, as the kernel prints them) whose inode is one of the rank's own sockets
(the links socket:[inode] in /proc/<pid>/fd): a stalled job's connections, read before it is stopped (facts/sockets.py).
"""

import glob
import json
import os
import sys
import time


def socket_inodes(pid):
    """The inodes of the sockets PID holds open."""
    inodes = set()
    for fd in glob.glob(f"/proc/{pid}/fd/*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def own_rows(table, inodes):
    """The rows of TABLE (the text of /proc/<pid>/net/tcp or tcp6) whose inode (the tenth field) is in INODES."""
    return [line.strip() for line in table.splitlines() if len(line.split()) > 9 and line.split()[9] in inodes]


def tcp_rows(pid):
    """PID's own rows of its network namespace's TCP tables."""
    inodes = socket_inodes(pid)
    rows = []
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as fh:
                rows += own_rows(fh.read(), inodes)
        except OSError:
            continue
    return rows


def main(out, sockets=False):
    beats = {}
    for path in glob.glob(os.path.join(out, "heartbeat", "*.json")):
        try:
            with open(path) as fh:
                beat = json.load(fh)
            beat["age"] = time.time() - os.stat(path).st_mtime
        except (OSError, ValueError):
            continue
        if sockets and isinstance(beat.get("pid"), int):
            beat["tcp"] = tcp_rows(beat["pid"])
        beats[os.path.basename(path)[5:-5]] = beat
    print(json.dumps(beats))


if __name__ == "__main__":
    main(sys.argv[1], "--sockets" in sys.argv[2:])
