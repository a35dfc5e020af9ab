"""How the facts collector probes a node (standard library only, Python 3.8): a command run under its deadline,
every command at once each in a thread of its own, a file read within a limit, and a probe that records its error
instead of raising (the control side reports "could not collect")."""

import shutil
import subprocess
import threading

OUTPUT_LIMIT = 200_000
FILE_LIMIT = 64_000
PROBE_TIMEOUT = 20.0  # seconds each probe command may take, unless --probe-timeout says otherwise


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


def matching_lines(command, needle, timeout=PROBE_TIMEOUT, keep=400):
    """The lines of COMMAND's output that hold NEEDLE (the first and the last KEEP/2 of them when there are more),
    with how many lines it printed in all: a whole log searched on the node, however long, and only what matters
    sent back. Never raises."""
    proc = _completed(command, timeout)
    if isinstance(proc, dict):
        return proc
    lines = proc.stdout.splitlines()
    found = [line for line in lines if needle in line]
    if len(found) > keep:
        found = found[: keep // 2] + found[-(keep - keep // 2) :]
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
    """Every probe command at once (an argv, or a function of the timeout that runs its own), each in a thread of its
    own (they wait on their programs, not on a CPU), each stopped at TIMEOUT seconds (a hung nvidia-smi is reported
    as such, the others still answer)."""
    results = {}

    def one(name, command):
        results[name] = command(timeout) if callable(command) else run(command, timeout)

    threads = [threading.Thread(target=one, args=item, daemon=True) for item in commands.items()]
    for thread in threads:
        thread.start()

    def wait():
        for thread in threads:
            thread.join()
        return {name: results[name] for name in commands}

    return wait
