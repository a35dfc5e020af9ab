"""A torch stage's results on a node, brought back in one command (standard library only, Python 3.8+; the
controller sends this file with `python -c`: stages/launch.py's collect_command).

argv: OUT, the stage's output directory in the run directory. Prints every rank record of the stage (OUT/rank-*.json,
then those of its parts, OUT/<part>/rank-*.json: remote/stages.py), one JSON document per line, then, after
LOGS_LINE, the stage's files as one gzipped tar in base64: the rank records, the ranks' last heartbeats, torchrun's
per-rank logs and the run's NCCL logs (regular files only). One command per node brings all of it back: a second
one to pack the files and a file transfer to fetch them cost every node two more sessions and the controller more
CPU.
"""

import base64
import glob
import io
import os
import sys
import tarfile

LOGS_LINE = "--- clustercheck: logs ---"  # the controller reads it too (launch.parse_collected)


def main(out):
    run_dir = os.path.dirname(out)
    parts = glob.glob(os.path.join(out, "*", "rank-*.json"))
    parts = [p for p in parts if os.path.basename(os.path.dirname(p)) != "heartbeat"]
    for path in sorted(glob.glob(os.path.join(out, "rank-*.json"))) + sorted(parts):
        with open(path) as fh:
            print(fh.read().strip())
    keep = []
    for top, dirs, files in os.walk(out):
        dirs.sort()
        keep += [os.path.join(top, name) for name in sorted(files)]
    keep += sorted(glob.glob(os.path.join(run_dir, "nccl-*.log")))
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as tar:
        for path in keep:
            if os.path.isfile(path) and not os.path.islink(path):
                tar.add(path, os.path.relpath(path, run_dir), recursive=False)
    print(LOGS_LINE)
    print(base64.b64encode(packed.getvalue()).decode())


if __name__ == "__main__":
    main(sys.argv[1])
