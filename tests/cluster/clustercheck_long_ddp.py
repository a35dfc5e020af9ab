"""`clustercheck` itself, with a DDP job of N steps: `python clustercheck_long_ddp.py N run ...`.

The tests need a DDP job that runs for minutes (to kill a rank in it, or press Ctrl-C); the product has no switch
for that, so this harness wraps the torch-job runner to add `--steps N` to the DDP worker's arguments, then hands
over to the real command line.
"""

import functools
import sys

from clustercheck import commands
from clustercheck.stages import torchjob


def with_steps(run, steps: str):
    """torchjob.run, with `--steps STEPS` given to the DDP worker (every other worker as it was)."""

    @functools.wraps(run)
    def wrapped(members, worker, ctx, **kwargs):
        if worker == "ddp":
            kwargs["worker_args"] = ["--steps", steps, *(kwargs.get("worker_args") or [])]
        return run(members, worker, ctx, **kwargs)

    return wrapped


if __name__ == "__main__":
    torchjob.run = with_steps(torchjob.run, sys.argv.pop(1))
    commands.main()
