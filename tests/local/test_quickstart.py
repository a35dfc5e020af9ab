"""The README's Quick start ends with its next step: the README's own train_ddp.py, saved in the current directory,
launched on localhost with `clustercheck launch --hosts localhost -- train_ddp.py`, as written (preflight included)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

from harness import CLUSTERCHECK

REPO = Path(__file__).resolve().parents[2]


def test_the_quick_starts_next_step_trains_the_readme_script_in_the_current_directory(tmp_path):
    readme = (REPO / "README.md").read_text()
    quick_start = readme.split("## Quick start\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", quick_start, re.S)
    line = next(c for block in blocks for c in block.splitlines() if c.startswith("clustercheck launch"))
    assert line == "clustercheck launch --hosts localhost -- train_ddp.py"
    script = re.search(r'```python\n("""train_ddp\.py:.*?)```', readme, re.S)
    assert script, "the README lost its train_ddp.py example"
    (tmp_path / "train_ddp.py").write_text(script.group(1))
    argv = shlex.split(line)
    # Its own rendezvous port, before the --, so that it runs beside other tests on the machine.
    argv[argv.index("--") : argv.index("--")] = ["--master-port", "29531", "--run-dir", str(tmp_path / "run")]
    proc = subprocess.run([CLUSTERCHECK, *argv[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert f"localhost/0: rank 0 of world size 1 on {os.uname().nodename}" in lines
    assert any(line.startswith("localhost/0: step 99 loss ") for line in lines)
    assert "the job completed on every node" in proc.stderr
