"""What the torchrun workers share: who this rank is, its heartbeat, and how its record is written and the rank ends.

The heartbeat: a small process forked from the rank at its start rewrites OUT_DIR/heartbeat/rank-<rank>.json every
second with the last step the rank reached (`progress(step, phase)`, called by the worker per step or collective,
kept in memory shared with it). A process, not a thread: a rank waiting in a torch call that holds the GIL (gloo
connecting to a peer that froze) still beats, as a waiting rank should. The controller's watchdog reads the
files: a rank whose file stops changing is frozen (its machine paused, or the rank stopped: the heartbeat stops
with it); one whose step stops changing makes no progress. Each beat also carries the CPU time the rank has used:
while a rank is still starting (importing torch and its libraries, step 0), that time growing is its progress. The
heartbeat also ends the rank when torchrun, its parent, is gone, so no rank outlives its job.
"""

from __future__ import annotations

import json
import mmap
import os
import signal
import socket
import struct
import sys
import time
import traceback

BEAT_INTERVAL = 1.0
STARTING = "starting"  # the phase of step 0, until the worker reports its first step (the watchdog knows it too)
_SLOT = struct.Struct("qq200s")  # part, step, phase (utf-8, zero-padded)
_shared = mmap.mmap(-1, _SLOT.size)  # anonymous and shared: the heartbeat process reads what the rank writes


def rank_identity() -> dict:
    """This rank as torchrun describes it, plus the host it runs on."""
    return {
        "rank": int(os.environ["RANK"]),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "host": socket.gethostname(),
    }


RAILS_ENV = "CLUSTERCHECK_RAIL_INTERFACES"  # the inventory's cluster_rail_interfaces, comma-separated


def rail_interface(local_rank: int):
    """The interface this rank's process group traffic goes through: item LOCAL_RANK mod len of the rails the
    controller gave (RAILS_ENV), else None (the node's cluster interface, as GLOO_SOCKET_IFNAME already says)."""
    rails = [r for r in os.environ.get(RAILS_ENV, "").split(",") if r]
    return rails[local_rank % len(rails)] if rails else None


def start_process_group(torch, dist, backend: str, local_rank: int):
    """Join the job's process group; returns this rank's device. With NCCL the rank's GPU is bound first and named to
    the group (torch >= 2.3's device_id), so NCCL need not guess the device from the global rank, which hangs a job
    whose ranks map to GPUs unevenly (torch warns so on every barrier otherwise). With rails, the rank's sockets
    (gloo's, NCCL's socket transport) bind to its rail's interface first."""
    import inspect

    rail = rail_interface(local_rank)
    if rail:
        os.environ["GLOO_SOCKET_IFNAME"] = os.environ["NCCL_SOCKET_IFNAME"] = rail
    if backend != "nccl":
        dist.init_process_group(backend=backend)
        return torch.device("cpu")
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)  # before the first collective, so NCCL binds this GPU
    if "device_id" in inspect.signature(dist.init_process_group).parameters:
        dist.init_process_group(backend=backend, device_id=device)
    else:
        dist.init_process_group(backend=backend)
    return device


def is_starting(phase: str | None) -> bool:
    """Whether PHASE is a rank's start (importing torch and its libraries), alone or in a part of a job of several:
    while it lasts, the CPU time the rank uses is its progress."""
    return phase is not None and (phase == STARTING or phase.endswith(": " + STARTING))


_part = ["", 0]  # the part of a job of several (remote/stages.py) this rank is in: its name and its number


def begin_part(number: int, name: str) -> None:
    """This rank begins part NUMBER (counted from 1), NAME, of a job that runs several: its heartbeat carries the
    number, so the watchdog orders the steps of every part (a rank in a later part is ahead of one at any step
    of an earlier part), and its phases are named with NAME."""
    _part[:] = [name, number]


def progress(step: int, phase: str | None = None) -> None:
    """This rank reached STEP (of PHASE): what its next heartbeat says."""
    if phase is None:
        phase = _read()[2]
    elif _part[0]:
        phase = f"{_part[0]}: {phase}"
    _shared[:] = _SLOT.pack(_part[1], step, phase.encode()[:200])


def _read() -> tuple[int, int, str]:
    part, step, phase = _SLOT.unpack(bytes(_shared[:]))
    return part, step, phase.rstrip(b"\0").decode(errors="replace")


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's name (its state first), or None when PID is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _stopped(fields: list[str] | None) -> bool:
    """Whether the process of FIELDS (_stat) is gone, or stopped (SIGSTOP, a debugger): no heartbeat for it then."""
    return not fields or fields[0] in ("T", "t", "Z", "X")


def _cpu_seconds(fields: list[str]) -> float | None:
    """The CPU time, user and system, the process of FIELDS (_stat) has used, in seconds."""
    try:
        return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)
    except (IndexError, ValueError, OSError):
        return None


def _beat(path: str, rank_pid: int, torchrun_pid: int) -> None:
    """The heartbeat process's loop (it runs the standard library only, and never returns). When the rank ends by
    itself, one last beat leaves its last step in the file: a rank may finish between two beats."""
    try:
        cpu = None
        while os.getppid() == rank_pid:  # the rank ended: so does its heartbeat
            if _parent_of(rank_pid) != torchrun_pid:  # torchrun is gone: end the rank too, then stop
                os.kill(rank_pid, signal.SIGKILL)
                break
            fields = _stat(rank_pid)
            if not _stopped(fields):
                cpu = _cpu_seconds(fields)
                _write_beat(path, rank_pid, cpu)
            time.sleep(BEAT_INTERVAL)
        else:
            _write_beat(path, rank_pid, cpu)
    except BaseException:
        pass
    os._exit(0)


def _write_beat(path: str, rank_pid: int, cpu: float | None) -> None:
    part, step, phase = _read()
    with open(path + ".tmp", "w") as fh:
        json.dump({"part": part, "step": step, "phase": phase, "pid": rank_pid, "cpu": cpu}, fh)
    os.replace(path + ".tmp", path)


def _parent_of(pid: int) -> int | None:
    fields = _stat(pid)
    try:
        return int(fields[1]) if fields else None
    except (IndexError, ValueError):
        return None


def start_heartbeat(out_dir: str, rank: int) -> None:
    """Fork the heartbeat process (before torch is imported, so the fork copies nothing of it)."""
    directory = os.path.join(out_dir, "heartbeat")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"rank-{rank}.json")
    progress(0, STARTING)
    rank_pid, torchrun_pid = os.getpid(), os.getppid()
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork() == 0:
        _beat(path, rank_pid, torchrun_pid)


def run_rank(out_dir: str, record: dict, work) -> int:
    """Run WORK(record) and write RECORD to OUT_DIR/rank-<rank>.json, with ok, seconds and any error: a rank's
    error is its result for the controller, not a crash (its traceback goes to stderr too). Returns the rank's exit
    code. The rank's heartbeat runs meanwhile."""
    start_heartbeat(out_dir, record["rank"])
    return run_part(out_dir, record, work)


def run_part(out_dir: str, record: dict, work) -> int:
    """run_rank's WORK(record) and RECORD written, without starting the heartbeat: one part of a job of several
    (remote/stages.py), each part's records and files in its own OUT_DIR."""
    os.makedirs(out_dir, exist_ok=True)
    record["ok"] = False
    started = time.monotonic()
    try:
        work(record)
        record["ok"] = True
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc(limit=5)
        # Also in the rank's output, as an uncaught exception would be: torchrun's report of a failed job names the
        # rank but not its error, and the controller quotes the rank's own traceback from that output.
        print(record["traceback"], end="", file=sys.stderr, flush=True)
    record["seconds"] = round(time.monotonic() - started, 3)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "rank-{}.json".format(record["rank"])), "w") as fh:
        json.dump(record, fh)
    return 0 if record["ok"] else 1


def exit_now(code: int) -> None:
    """Leave without interpreter teardown: with gloo, torch can abort there ("terminate called without an
    active exception") after the work is done and the record written, turning a good run into a failed rank."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
