"""The torch stages' work in one torchrun job, run on every node (standard library and torch; Lightning in its part).

    stages --out DIR --backend B --parts JSON

JSON maps each part to its own arguments, in the order the parts run: `local` (the collectives across each node's
own ranks: the core stage's local.* checks), `collectives`, `ddp`, `lightning`; each part takes the arguments of
its program run alone (remote/collectives.py, ddp.py, lightning.py), less --out and --backend. Every rank starts,
imports torch and joins the process group once, then runs the parts one after the other on that group; each
part's record goes to DIR/<part>/rank-<rank>.json as soon as the part ends, with "part" naming it, so a job that
fails in a later part keeps the earlier parts' results. A part that raises ends the rank there (its record says
why), as the program run alone would: the ranks waiting for it in a collective are stopped with the job. The
heartbeat carries the part's number (common.begin_part), so the watchdog names the part a stalled node was in.

One start per job instead of one per stage: torchrun and the ranks' `import torch` (and the process group's
rendezvous) are paid once, not three or four times.
"""

from __future__ import annotations

import argparse
import json
import os

from . import collectives, ddp, lightning
from .common import begin_part, exit_now, rank_identity, run_part, start_heartbeat, start_process_group

# part -> (its program's parser, its work on the process group), in the order parts may run
PARTS = {
    "local": (collectives.parser, collectives.local_part),
    "collectives": (collectives.parser, collectives.part),
    "ddp": (ddp.parser, ddp.part),
    "lightning": (lightning.parser, lightning.part),
}


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[tuple[str, argparse.Namespace]]]:
    """The job's arguments, and each part's own (its program's parser, with the job's --out DIR/<part> and
    --backend), in the order given."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    parser.add_argument("--parts", required=True, help="JSON: part -> its arguments, in the order they run")
    args = parser.parse_args(argv)
    try:
        wanted = json.loads(args.parts)
    except ValueError as exc:
        parser.error(f"--parts: not JSON: {exc}")
    unknown = [name for name in wanted if name not in PARTS]
    if unknown or not wanted:
        parser.error(f"--parts: {', '.join(unknown) or 'none given'}: not a part ({', '.join(PARTS)})")
    parts = []
    for name, part_argv in wanted.items():
        out = os.path.join(args.out, name)
        parts.append((name, PARTS[name][0]().parse_args([*part_argv, "--out", out, "--backend", args.backend])))
    return args, parts


def main() -> int:
    args, parts = parse()
    identity = rank_identity()
    start_heartbeat(args.out, identity["rank"])
    joined: list = []  # this rank's device, once it joined the process group (in the first part: a failure to join
    # is that part's result, as it is a program's run alone)

    def work(record: dict, run, part_args) -> None:
        import torch
        import torch.distributed as dist

        if not joined:
            joined.append(start_process_group(torch, dist, args.backend, identity["local_rank"]))
        run(part_args, torch, dist, joined[0], record)

    for number, (name, part_args) in enumerate(parts, 1):
        begin_part(number, name)
        record = {**identity, "part": name}
        code = run_part(part_args.out, record, lambda r, run=PARTS[name][1], a=part_args: work(r, run, a))
        if code:
            return code
    return 0


if __name__ == "__main__":
    exit_now(main())
