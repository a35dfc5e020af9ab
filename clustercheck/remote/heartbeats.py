"""Every rank's last heartbeat on a node (standard library only, Python 3.8+; the controller sends this file with
`python -c`: stages/launch.py's progress_command).

argv: OUT, the stage's output directory. Prints one JSON object, each rank's heartbeat by its number
(OUT/heartbeat/rank-N.json: step, phase) with its age in seconds, measured on the node's own clock; a heartbeat
being written or gone is left out.
"""

import glob
import json
import os
import sys
import time


def main(out):
    beats = {}
    for path in glob.glob(os.path.join(out, "heartbeat", "*.json")):
        try:
            with open(path) as fh:
                beat = json.load(fh)
            beat["age"] = time.time() - os.stat(path).st_mtime
        except (OSError, ValueError):
            continue
        beats[os.path.basename(path)[5:-5]] = beat
    print(json.dumps(beats))


if __name__ == "__main__":
    main(sys.argv[1])
