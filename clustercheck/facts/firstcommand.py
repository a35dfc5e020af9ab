"""The first command on a node (stages/core.start): the script that reads its identity, clock, login shell and
python (and the startup sweep's and the facts collector's output after it), and its output parsed. Pure logic, no
I/O."""

from __future__ import annotations

import contextlib
import functools
import shlex
from dataclasses import dataclass
from importlib import resources

from clustercheck.facts import filesystems


@dataclass(frozen=True)
class Identity:
    """What tells one running machine from another. Each alone can be shared: systemd's machine ID by clones of an
    image that was not reset, the kernel's boot ID by containers on one kernel, the hostname by anything; all three
    together only by the same machine reached under two names."""

    machine_id: str | None  # /etc/machine-id
    boot_id: str | None  # /proc/sys/kernel/random/boot_id
    hostname: str | None  # uname -n

    @property
    def key(self) -> tuple[str, str, str] | None:
        """What two names of one machine share; None when the boot ID could not be read (nothing to compare)."""
        if not self.boot_id:
            return None
        return (self.machine_id or "", self.boot_id, self.hostname or "")


# sh -c IDENTITY_SCRIPT: the three lines parse_identity reads (an empty line where a file cannot be read).
IDENTITY_SCRIPT = (
    "echo machine_id=$(cat /etc/machine-id 2>/dev/null); "
    "echo boot_id=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null); "
    "echo hostname=$(uname -n)"
)


def parse_identity(text: str) -> Identity | None:
    """IDENTITY_SCRIPT's output (or the first command's, which holds it); None when it holds none of its lines."""
    found: dict[str, str | None] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key in ("machine_id", "boot_id", "hostname"):
            found[key] = value.strip() or None
    if not found:
        return None
    return Identity(found.get("machine_id"), found.get("boot_id"), found.get("hostname"))


LEFTOVERS_LINE = "--- leftovers"  # in the first command's output: the startup sweep's lines follow
FACTS_LINE = "--- facts"  # ... and the facts collector's output after this one


@functools.cache
def filesystems_script() -> str:
    """remote/filesystems.sh without its comments, as `sh -c` runs it: the file systems a program needs, read
    without Python (facts/filesystems.py parses its lines)."""
    text = resources.files("clustercheck.remote").joinpath("filesystems.sh").read_text()
    return "\n".join(line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))


def first_script(recorded: str, sweep: str | None = None, then: str | None = None, paths: tuple[str, ...] = ()) -> str:
    """The first command on a node (sh -c FIRST_SCRIPT sh CANDIDATE FALLBACK SECONDS ...): the node's clock (first,
    on a line of its own, so that its arrival times it), its identity (IDENTITY_SCRIPT), the login shell and home
    directory, the python to run the node-side programs with (CANDIDATE; when empty, the first line of the file
    RECORDED, else FALLBACK) in $py and whether it starts within SECONDS in $runs (yes or no), the file systems a job
    needs (filesystems_script; PATHS: CLASS=PATH pairs besides /tmp, /dev/shm and the home); then SWEEP's output
    (the startup sweep) after LEFTOVERS_LINE. All of it after the clock is written at once (each write is a packet
    the controller handles), and none of it reads standard input, which is THEN's: the shell that follows
    FACTS_LINE, with $py, $runs and the arguments after SECONDS. parse_first reads the output."""
    steps = [
        f'o="$({IDENTITY_SCRIPT})${{nl}}shell=$SHELL${{nl}}home=$HOME${{nl}}"',
        'py=$1; if [ -z "$py" ]; then '
        f"py=$(sed -n 's/^[[:space:]]*//; s/[[:space:]]*$//; /./{{p;q;}}' {shlex.quote(recorded)} 2>/dev/null); "
        'if [ -n "$py" ]; then o="${o}recorded=$py$nl"; else py=$2; fi; fi',
        'if timeout -k 1 "$3" "$py" -c "import sys" >/dev/null 2>&1; then runs=yes; else runs=no; fi',
        'o="${o}python=$py${nl}python_runs=$runs$nl"',
        f"fs=$(sh -c {shlex.quote(filesystems_script())} sh {' '.join(shlex.quote(p) for p in paths)})",
        'o="${o}${fs:+$fs$nl}"',
    ]
    if sweep is not None:
        steps.append(f'swept=$({sweep}); o="${{o}}{LEFTOVERS_LINE}$nl${{swept:+$swept$nl}}"')
    script = "nl='\n'; " + 'echo "clock=$(date +%s.%N)"; { ' + "; ".join(steps) + "; } </dev/null"
    if then is None:
        return script + '; printf %s "$o"'
    return script + f'; printf %s "$o{FACTS_LINE}$nl"; {then}'


@dataclass(frozen=True)
class FirstAnswer:
    """What first_script printed; None for each line it did not print."""

    clock: float | None  # the node's time, epoch seconds, when the command started
    identity: Identity | None
    shell: str | None  # the login shell ($SHELL)
    home: str | None
    recorded: str | None  # the python recorded on the node, when CANDIDATE was empty and the file named one
    python: str | None  # the python it tried
    python_runs: bool | None
    filesystems: filesystems.Filesystems | None  # the file systems a job needs; None: not read
    leftovers: str | None  # the startup sweep's output, None when it did not run
    then: str | None  # what followed FACTS_LINE, None when nothing did


def parse_first(text: str) -> FirstAnswer:
    """first_script's output."""
    text, has_then, then = text.partition(FACTS_LINE + "\n")
    head, swept, tail = text.partition(LEFTOVERS_LINE + "\n")
    head = head[: head.rfind("\n") + 1]  # a line cut short (the session closed under it) is not read
    found: dict[str, str] = {}
    for line in head.splitlines():
        key, eq, value = line.partition("=")
        if eq and key in ("clock", "shell", "home", "recorded", "python", "python_runs"):
            found[key] = value.strip()
    clock = None
    with contextlib.suppress(ValueError):
        clock = float(found.get("clock", ""))
    runs = found.get("python_runs")
    return FirstAnswer(
        clock=clock,
        identity=parse_identity(head),
        shell=found.get("shell") or None,
        home=found.get("home") or None,
        recorded=found.get("recorded") or None,
        python=found.get("python") or None,
        python_runs=None if runs is None else runs == "yes",
        filesystems=filesystems.parse(head),
        leftovers=tail if swept else None,
        then=then if has_then else None,
    )
