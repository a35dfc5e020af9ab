"""How the facts collector probes a node (standard library only, Python 3.8): a command run under its deadline,
every command at once each in a thread of its own, a file read within a limit, and a probe that records its error
instead of raising (the control side reports "could not collect")."""

import os
import shutil
import subprocess
import threading
import time

# Every process a clustercheck run starts on a node carries RUN_MARKER=<run id> in its environment, and UNTIL_MARKER=
# <deadline, epoch seconds> (the controller's transport sets both, transport/__init__.py imports them from here): the
# startup sweep stops what an ended run left by them, and a port's or a GPU's holder is recognised as a clustercheck
# job by them (run_of).
RUN_MARKER = "CLUSTERCHECK_RUN"
UNTIL_MARKER = "CLUSTERCHECK_UNTIL"
OUTPUT_LIMIT = 200_000
FILE_LIMIT = 64_000
# The first lines of every program run on a node with `python -c`: -c puts the working directory first on sys.path
# (as ""), where a user's file (cuda.py, json.py) would shadow a module the program or torch imports; taken off
# before anything is imported, as `python -P` does from 3.11 on.
NO_WORKING_DIRECTORY = 'import sys\nif sys.path[:1] == [""]:\n    del sys.path[0]\n'
PROBE_TIMEOUT = 20.0  # seconds each probe command may take, unless --probe-timeout says otherwise
HUNG_SLACK = 1.0  # seconds past TIMEOUT run_all waits for a probe before it gives it up as hung
HUNG = "hung: "  # how a probe given up as hung begins its error (the control side reads it: checks/registry.py)


def _completed(command, timeout):
    """COMMAND's finished process, or the probe's {"error": ...} where it is missing, timed out or could not start."""
    if not shutil.which(command[0]):
        return {"error": f"{command[0]} not found"}
    try:
        return subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"{command[0]} timed out after {timeout:g} s"}
    except OSError as exc:
        return {"error": f"{command[0]}: {exc}"}


def run(command, timeout=PROBE_TIMEOUT):
    """Run a probe command; never raises."""
    proc = _completed(command, timeout)
    if isinstance(proc, dict):
        return proc
    return {"rc": proc.returncode, "out": proc.stdout[-OUTPUT_LIMIT:], "err": proc.stderr[-2000:]}


def matching_lines(command, needle, timeout=PROBE_TIMEOUT, keep=400, always=()):
    """The lines of COMMAND's output that hold NEEDLE (a string, or a tuple of strings: any of them), the first and
    the last KEEP/2 of them when there are more (a line holding one of ALWAYS is kept wherever it is), with how many
    lines it printed in all: a whole log searched on the node, however long, and only what matters sent back. Never
    raises."""
    proc = _completed(command, timeout)
    if isinstance(proc, dict):
        return proc
    lines = proc.stdout.splitlines()
    needles = (needle,) if isinstance(needle, str) else tuple(needle)
    found = [line for line in lines if any(n in line for n in needles)]
    if len(found) > keep:
        kept = set(range(keep // 2)) | set(range(len(found) - (keep - keep // 2), len(found)))
        kept |= {i for i, line in enumerate(found) if any(n in line for n in always)}
        found = [line for i, line in enumerate(found) if i in kept]
    return {"rc": proc.returncode, "lines": found, "read": len(lines), "err": proc.stderr[-2000:]}


def probe(function):
    try:
        return function()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def read_text(path, limit=FILE_LIMIT):
    with open(path, errors="replace") as fh:
        return fh.read(limit)


def run_all(commands, timeout=PROBE_TIMEOUT):
    """Every probe at once (an argv, or a function of the timeout that runs its own), each in a thread of its own
    (they wait on their programs or files, not on a CPU), each command stopped at TIMEOUT seconds (a hung
    nvidia-smi is reported as such, the others still answer). The function returned waits for them, at most TIMEOUT
    + HUNG_SLACK seconds from the start in all: a probe that has not answered then (a process the kernel cannot
    kill, stuck in a driver; a read of a file that never returns) is given up, its thread left behind, and reported
    with an error that begins with HUNG and names it, so the collector still answers, within its time, with
    everything else."""
    results = {}
    started = time.monotonic()

    def one(name, command):
        results[name] = command(timeout) if callable(command) else run(command, timeout)

    threads = [threading.Thread(target=one, args=item, daemon=True) for item in commands.items()]
    for thread in threads:
        thread.start()

    def wait():
        until = started + timeout + HUNG_SLACK
        for thread in threads:
            thread.join(max(0.0, until - time.monotonic()))
        answered = dict(results)  # a probe that answers from now on is not waited for
        return {
            name: answered[name] if name in answered else hung(name, command, timeout)
            for name, command in commands.items()
        }

    return wait


def hung(name, command, timeout):
    """The error of probe NAME (COMMAND: an argv or a function) given up after TIMEOUT seconds."""
    what = " ".join(command) if isinstance(command, (list, tuple)) else name
    return {"error": f"{HUNG}{what} gave no answer within {timeout:g} s"}


def run_of(pid, proc="/proc"):
    """The clustercheck run process PID belongs to, by the markers in its environment: {"run", "until" (None
    without a deadline), "user", "started" (epoch seconds)}; None for a process of no run, or one whose
    environment this user cannot read (another user's, without root)."""
    try:
        with open(f"{proc}/{pid}/environ", "rb") as fh:
            environ = dict(
                entry.split("=", 1) for entry in fh.read().decode(errors="replace").split("\0") if "=" in entry
            )
    except OSError:
        return None
    if not environ.get(RUN_MARKER):
        return None
    found = {"run": environ[RUN_MARKER], "until": None, "user": None, "started": None}
    if environ.get(UNTIL_MARKER, "").isdigit():
        found["until"] = int(environ[UNTIL_MARKER])
    try:
        import pwd

        with open(f"{proc}/{pid}/status") as fh:
            uid = next(int(line.split()[1]) for line in fh if line.startswith("Uid:"))
        found["user"] = pwd.getpwuid(uid).pw_name
    except (OSError, StopIteration, KeyError, ValueError):
        pass
    try:
        with open(f"{proc}/{pid}/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime: clock ticks after boot
        with open(f"{proc}/stat") as fh:
            boot = next(int(line.split()[1]) for line in fh if line.startswith("btime "))
        found["started"] = boot + ticks // os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError, IndexError):
        pass
    return found
