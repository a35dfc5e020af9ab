"""The programs clustercheck runs on the nodes, as one package (standard library only, plus torch in the torch
workers; Python 3.8 and later, the oldest python of a supported Ubuntu).

It is uploaded once per node and run from there as `python -m clustercheck_remote.<program>` (the controller side
is clustercheck/stages/bundle.py): `facts` (the facts collector), `netprobe` (the network probe), the torchrun
workers `collectives`, `ddp` and `lightning` (each also a part of `stages`, the run's one torch job), which share
`common`.
"""
