"""`clustercheck launch`: the user's own training script across the verified cluster, under torchrun on every
node; and the detached jobs (`jobs`, `logs`, `stop`).

start.py      a launch from the command line's request: where it runs (SSH, the allocation this runs in, or a
              batch job), the options checked, then the Launch's steps
batchjob.py   a launch as a Slurm batch job from the login node (its script from slurm/batch.py, submitted and
              followed through slurm/jobs.py), and such jobs listed, shown and stopped
jobs.py       jobs, logs and stop on the nodes of a detached job (a Slurm job id goes to batchjob.py)
command.py    the user's torchrun options and script -> one torchrun command line per node (pure)
output.py     a node's streamed output -> lines prefixed with node/rank (pure)
sameness.py   what the code is, the script's directory hashed on every node, and the comparison (pure, plus the
              node-side program, which also records the launches from a directory so their outputs are not code)
detached.py   a job under a transient systemd unit on each node: the command lines and their answers (pure)
records.py    the control machine's record of a detached job, so `logs JOB` and `stop JOB` find its nodes
job.py        what a launch is: its options, how it refuses to start (NotStarted), how a foreground job ends
session.py    a launch from start to end (Launch), each step in its own module:
  preflight.py    the core and network stages through the pipeline; a FAIL or ERROR refuses the launch
  connect.py      every node reached, its python and cluster address found (the facts collector)
  codesync.py     the code compared on every node, or uploaded with --sync; the running-from-here records
  foreground.py   the job on the torch-job runner (stages/runner.py), output streamed with node/rank prefixes
  background.py   a systemd unit per node (--detach), started on all of them or on none
connections.py  the nodes of a detached job reached again for `jobs`, `logs` and `stop`
"""
