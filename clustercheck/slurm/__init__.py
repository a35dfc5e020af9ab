"""Slurm: every part of clustercheck that speaks to it or reads what it says.

Pure (no command run):
  parse.py       what Slurm's commands answer: scontrol show node and show job, squeue, salloc's and sbatch's
                 answers, job ids, srun's version
  drain.py       node-health's decision: drain its node on a FAIL, resume it from a drain of its own; the one drain
                 reason format (reason, read_reason)
  breaker.py     the circuit breaker: whether a drain would put more of a partition's nodes out than allowed
  epilog.py      what a job left on its node (its user's processes, /dev/shm), read here and judged
  diagnose.py    why srun could not run a step on a node, from srun's words and the node's state, and Slurm's fix
  grant.py       what Slurm can grant a request (its nodes and partitions read first), refused at once naming each
                 node it keeps out with Slurm's reason; why a request waits (squeue's reason)
  request.py     what to ask Slurm for outside an allocation (--nodes, --nodelist, --partition, --account, --time)
  batch.py       `launch --slurm`'s batch script

Calling Slurm (every command through call.py's call(); a failed one said by CommandResult.cause, as on a node):
  call.py        the one way a Slurm command runs here, and SlurmError
  allocation.py  the allocation a command runs in, or asks for (salloc, Slurm's nodes read first, its reason said
                 while it waits) and gives back, and its nodes
  step.py        a job step on one node: srun's options by Slurm's version, its srun line, the node as scontrol
                 shows it, and the factory of the transports that run commands as such steps (transport/srun.py;
                 run --slurm, launch inside an allocation)
  jobs.py        a launch's batch job: submitted, followed, cancelled, listed
  update.py      node-health's scontrol on its own node: read, drained or resumed; squeue for the jobs on it
"""
