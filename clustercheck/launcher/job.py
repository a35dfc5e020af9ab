"""What a launch is and what its parts share: the options, how a launch refuses to start, how a foreground job
ends, and where the job runs on a node."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from clustercheck.config import DEFAULT_COMMAND_TIMEOUT, DEFAULT_MASTER_PORT, NodeOptions
from clustercheck.inventory import Node
from clustercheck.launcher import command as cmd
from clustercheck.reach import Reach
from clustercheck.stages import Member
from clustercheck.transport import TransportError
from clustercheck.transport.params import SshSettings

FOREVER = 10 * 365 * 24 * 3600.0  # a training job has no deadline of ours

Echo = Callable[[str], None]


class NotStarted(Exception):
    """The job was not started (preflight, a node, the code); the message is one line."""


class HostKeysRefused(NotStarted):
    """A host key was unknown or changed: nothing was run there."""


@dataclass(frozen=True, kw_only=True)
class LaunchOptions(NodeOptions):
    """A launch as checked and resolved (launcher/start.py): --python, --container (the job runs inside this image
    on every node) and --nproc-per-node are NodeOptions', shared with the request and the preflight's RunConfig."""

    command: cmd.UserCommand
    run_dir: Path
    ssh: SshSettings = field(default_factory=SshSettings)
    master_port: int = DEFAULT_MASTER_PORT
    env: dict[str, str] = field(default_factory=dict)
    sync: Path | None = None
    chdir: str | None = None
    preflight: bool = True
    spare: int = 0  # --spare: how many of the nodes are spares the preflight may leave out
    detach: bool = False
    facts_timeout: float = float(DEFAULT_COMMAND_TIMEOUT)
    inventory: str | None = None  # --hosts when it is an inventory: the preflight's fix commands name it


@dataclass
class Finished:
    """How a foreground job ended: the exit status clustercheck passes on, and what to say about it."""

    status: int
    message: str


def each(reach: Reach, members: list[Member], function: Callable[[Member], None], what: str) -> None:
    """FUNCTION on every member at once; the first member's trouble, in inventory order, refuses the launch."""
    answers = reach.each(function, members, name=lambda m: m.name)
    for i, m in enumerate(members):
        answer = answers.get(i)
        if isinstance(answer, NotStarted):
            raise answer
        if isinstance(answer, TransportError | OSError):
            raise NotStarted(f"{m.name}: {what}: {answer}")
        if isinstance(answer, BaseException):
            raise answer


_CD = 'd=$1; shift; case "$d" in "~") d=$HOME ;; "~/"*) d="$HOME/${d#"~/"}" ;; esac; cd "$d" && exec "$@"'


def work_dir(node: Node, cwd: str | None) -> str | None:
    """Where the job runs on NODE: CWD (--chdir, or the synced copy); without one, the current directory on the
    control machine itself (where the same-code check looked the script up) and the home directory over SSH
    (None: where the connection lands)."""
    if cwd:
        return cwd
    return os.getcwd() if node.is_local else None


def in_dir(command: list[str], cwd: str | None) -> list[str]:
    """COMMAND run in CWD on the node (None: where the connection lands, the home directory)."""
    if not cwd:
        return command
    return ["sh", "-c", _CD, "sh", cwd, *command]
