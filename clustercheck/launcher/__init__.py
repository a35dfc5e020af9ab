"""`clustercheck launch`: the user's own training script across the verified cluster, under torchrun on every
node; and the detached jobs (`jobs`, `logs`, `stop`).

command.py    the user's torchrun options and script -> one torchrun command line per node (pure)
output.py     a node's streamed output -> lines prefixed with node/rank (pure)
sameness.py   what the code is, the script's directory hashed on every node, and the comparison (pure, plus the
              node-side program, which also records the launches from a directory so their outputs are not code)
detached.py   a job under a transient systemd unit on each node: the command lines and their answers (pure)
records.py    the control machine's record of a detached job, so `logs JOB` and `stop JOB` find its nodes
session.py    the I/O: connecting, the preflight, the checks, starting, streaming and stopping
"""
