"""`clustercheck` itself, with a DDP job of N steps: `python clustercheck_long_ddp.py N run ...`.

The tests need a DDP job that runs for minutes (to kill a rank in it, or press Ctrl-C); the product has no switch
for that, so this harness wraps the DDP stage's part of the run's torch job to add `--steps N` to its arguments,
then hands over to the real command line.
"""

import functools
import sys

from clustercheck import commands
from clustercheck.stages import ddp


def with_steps(part_args, steps: str):
    """The DDP stage's part_args, with `--steps STEPS` first."""

    @functools.wraps(part_args)
    def wrapped(members, ctx):
        return ["--steps", steps, *part_args(members, ctx)]

    return wrapped


if __name__ == "__main__":
    ddp.part_args = with_steps(ddp.part_args, sys.argv.pop(1))
    commands.main()
