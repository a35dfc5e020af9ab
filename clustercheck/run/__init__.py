"""Running the stages over the nodes: `clustercheck run` from its request (verify.py), the pipeline that drives the
stages and cleans every node up (pipeline.py, and its parts: hosts.py, record.py, multinode.py, nodelocal.py,
results.py, abort.py), its status line (progress.py); and `clustercheck node-health`, the
per-node checks on this machine (health.py)."""
