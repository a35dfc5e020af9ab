"""`clustercheck` itself, with a DDP job of N steps: `python clustercheck_long_ddp.py N run ...`.

The tests need a DDP job that runs for minutes (to kill a rank in it, or press Ctrl-C); the product has no switch
for that, so this harness sets the DDP stage's worker arguments before handing over to the real command line.
"""

import sys

from clustercheck import cli
from clustercheck.stages import ddp

if __name__ == "__main__":
    ddp.WORKER_ARGS[:] = ["--steps", sys.argv.pop(1)]
    cli.main()
