"""`python clustercheck-remote.pyz PROGRAM ARGS...`: run one of the package's programs as __main__."""

import runpy
import sys

if __name__ == "__main__":
    if len(sys.argv) < 2:
        programs = "facts|netprobe|data|gpubench|gpuburn|collectives|ddp|lightning|stages"
        sys.exit(f"usage: clustercheck-remote.pyz {programs} ARGS...")
    program = sys.argv[1]
    sys.argv = [f"{sys.argv[0]}:{program}", *sys.argv[2:]]
    runpy.run_module("clustercheck_remote." + program, run_name="__main__", alter_sys=True)
