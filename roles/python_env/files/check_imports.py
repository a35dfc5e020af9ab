"""Import every named distribution's top-level modules in this Python; print what fails, as one JSON line.

Run by the python_env role with the environment's own python after it is built: a package that is
installed but does not import (torchvision built for another torch: "operator torchvision::nms does
not exist") fails the play here, naming the package, instead of failing the user's first job.
Standard library only (Python 3.8 and later).
"""

import importlib
import json
import re
import sys
from importlib import metadata


def top_level_modules(dist_name):
    dist = metadata.distribution(dist_name)
    text = dist.read_text("top_level.txt")
    if text:
        names = [line.strip() for line in text.splitlines() if line.strip()]
    else:
        names = []
        for path in dist.files or []:
            first = path.parts[0]
            if first.endswith((".dist-info", ".data")) or first.startswith(("..", "__pycache__")) or first == "bin":
                continue
            name = first[:-3] if first.endswith(".py") else first
            if "." not in name and name not in names:
                names.append(name)
    public = [n.replace("/", ".") for n in names if not n.startswith("_")]
    return public or [re.sub(r"[-.]", "_", dist_name)]


def main(requirements):
    failures = []
    for requirement in requirements:
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
        if not name:
            continue
        dist_name = name.group(0)
        try:
            modules = top_level_modules(dist_name)
        except metadata.PackageNotFoundError:
            failures.append({"package": dist_name, "error": "not installed"})
            continue
        for module in modules:
            try:
                importlib.import_module(module)
            except Exception as exc:  # any import failure is the finding
                failures.append({"package": dist_name, "module": module, "error": f"{type(exc).__name__}: {exc}"})
                break
    # One marked line: what imports print (torch's warnings) shares the output on a terminal.
    print("CLUSTERCHECK_IMPORT_FAILURES " + json.dumps(failures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
