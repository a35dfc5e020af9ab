"""Why srun could not run a step on a node, told from what srun printed and how Slurm shows the node (`scontrol show
node`), with the fix that applies: nothing went over SSH, so SSH's advice (sshd, the SSH user and key) does not.
Pure: the srun transport (transport/srun.py) runs the commands.

srun's words are Slurm's error strings (src/common/slurm_errno.c), as srun 22.05 prints them (recorded in
tests/unit/data/slurm/): "Communication connection failure" when the node's slurmd does not answer (stopped, or its
host unreachable), "Zero Bytes were transmitted or received" when it answers but takes nothing, as when the two
sides cannot authenticate each other (a node re-imaged with another MUNGE key: slurmd logs "Munge decode failed:
Invalid credential"), "Requested node configuration is not available" when the node is not one the job holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustercheck.slurm.parse import SlurmNode
from clustercheck.transport import CommandResult

# What srun says (Slurm's error strings, src/common/slurm_errno.c), by what it means for the node.
UNANSWERED = ("Communication connection failure", "Socket timed out on send/recv operation")
UNAUTHENTICATED = (
    "Zero Bytes were transmitted or received",
    "Protocol authentication error",
    "Invalid authentication credential",
)
KEPT_OUT = ("Required node not available", "Requested node configuration is not available")
DOWN_FLAGS = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "POWERED_DOWN", "POWER_DOWN", "MAINT", "RESERVED")


@dataclass(frozen=True)
class Refused:
    """Why no step ran on the node (one line: srun's words, their meaning, Slurm's view of the node), and the fix."""

    said: str
    fix: str


def srun_error(stderr: str) -> str | None:
    """The line of srun's STDERR that says the most, without its `srun: error: ` prefix: the task launch that failed
    on the node (`Task launch for StepId=1.1 failed on node node3: ...`), else the first error naming a known cause,
    else the last error line, else the last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line.removeprefix("srun: error: ") for line in lines if line.startswith("srun: error: ")]
    known = UNANSWERED + UNAUTHENTICATED + KEPT_OUT
    chosen = (
        next((e for e in errors if e.startswith("Task launch for ")), None)
        or next((e for e in errors if any(k in e for k in known)), None)
        or (errors[-1] if errors else None)
        or (lines[-1].removeprefix("srun: ") if lines else None)
    )
    return chosen


def shown(node: SlurmNode | str) -> str:
    """How Slurm shows the node, in words: `IDLE+NOT_RESPONDING (Not responding)`, or why it could not be read."""
    if isinstance(node, str):
        return f"its state in Slurm unknown: {node}"
    reason = f" ({node.reason})" if node.reason else ""
    return f"Slurm shows it {'+'.join(node.state)}{reason}"


def step_refused(name: str, answer: CommandResult, node: SlurmNode | str) -> Refused:
    """Why no job step ran on node NAME: ANSWER is the step's (srun's) result, NODE how Slurm shows it (or why that
    could not be read)."""
    error = srun_error(answer.stderr)
    state = shown(node)
    flags = node.state if isinstance(node, SlurmNode) else ()
    if answer.timed_out:
        return Refused(
            f"srun did not start it within its deadline ({error or 'nothing said'}); {state}",
            f"Look at slurmd on {name} (systemctl status slurmd, journalctl -u slurmd there): it may hang; "
            f"scontrol show node {name} says how Slurm sees it.",
        )
    if error and any(k in error for k in UNAUTHENTICATED):
        return Refused(
            f"srun: {error}: {name}'s slurmd answered but took nothing, most likely as srun and it cannot "
            f"authenticate each other (MUNGE); {state}",
            f"Give {name} the cluster's MUNGE key (the same /etc/munge/munge.key as this machine and the controller, "
            f"owner munge, mode 0400), restart munge and slurmd there, and check its clock; `munge -n | ssh {name} "
            "unmunge` proves it (the setup playbook's slurm role distributes the key).",
        )
    if error and any(k in error for k in UNANSWERED):
        return Refused(
            f"srun: {error}: slurmd on {name} does not answer; {state}",
            f"Start slurmd on {name} (systemctl start slurmd; why it stopped: journalctl -u slurmd there) and check "
            f"that scontrol show node {name} no longer says NOT_RESPONDING or DOWN (scontrol update nodename={name} "
            "state=resume once it answers, if Slurm set it DOWN).",
        )
    if (error and any(k in error for k in KEPT_OUT)) or any(f.rstrip("*") in DOWN_FLAGS for f in flags):
        return Refused(
            f"srun: {error or 'no step'}: Slurm keeps {name} out; {state}",
            f"Find out why Slurm keeps {name} out (scontrol show node {name}: its state and reason), fix that, and "
            f"resume it (scontrol update nodename={name} state=resume); or run on an allocation without it.",
        )
    return Refused(
        f"srun: {error or answer.cause()}; {state}",
        f"Read srun's error, and slurmd's log on {name} (journalctl -u slurmd there); scontrol show node {name} says "
        "how Slurm sees it.",
    )
