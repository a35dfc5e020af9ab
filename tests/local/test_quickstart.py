"""The README's Quick start ends with its next step: the repository's examples/train_ddp.py, copied into a directory
of its own, launched on localhost with `clustercheck launch --hosts localhost -- train_ddp.py`, as written
(preflight included), with as many ranks as `clustercheck run` uses there."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

from harness import CLUSTERCHECK

REPO = Path(__file__).resolve().parents[2]


def test_the_quick_starts_next_step_trains_the_readme_script_in_a_directory_of_its_own(tmp_path):
    readme = (REPO / "README.md").read_text()
    quick_start = readme.split("## Quick start\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", quick_start, re.S)
    lines = [c.split("#")[0].strip() for block in blocks for c in block.splitlines()]
    line = next(c for c in lines if c.startswith("clustercheck launch"))
    assert line == "clustercheck launch --hosts localhost -- train_ddp.py"
    # The script goes into a new directory, not the checkout (whose files launch would compare): the README's
    # own line, run from the checkout, with this test's directory as the home directory.
    made = lines[lines.index(line) - 1]
    assert made == "mkdir -p ~/ddp-example && cp examples/train_ddp.py ~/ddp-example/ && cd ~/ddp-example"
    home = {**os.environ, "HOME": str(tmp_path)}
    where = subprocess.run(
        ["sh", "-c", f"{made} && pwd"], cwd=REPO, env=home, capture_output=True, text=True, check=True
    )
    directory = Path(where.stdout.strip())
    assert directory == tmp_path / "ddp-example" and sorted(p.name for p in directory.iterdir()) == ["train_ddp.py"]
    argv = shlex.split(line)
    # Its own rendezvous port, before the --, so that it runs beside other tests on the machine.
    argv[argv.index("--") : argv.index("--")] = ["--master-port", "29531", "--run-dir", str(tmp_path / "run")]
    scratch = tmp_path / "tmpdir"  # its TMPDIR: torch's compile cache goes to the job's directory, not there
    scratch.mkdir()
    proc = subprocess.run(
        [CLUSTERCHECK, *argv[1:]],
        cwd=directory,
        env={**os.environ, "TMPDIR": str(scratch)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(scratch.iterdir()) == []
    assert "the same 1 file(s) on every node" in proc.stderr  # the script alone, not a checkout's files
    lines = proc.stdout.splitlines()
    # Two CPU ranks on this machine without a GPU, as `clustercheck run --hosts localhost` uses.
    for rank in (0, 1):
        assert f"localhost/{rank}: rank {rank} of world size 2 on {os.uname().nodename}" in lines
    assert any(line.startswith("localhost/0: step 99 loss ") for line in lines)
    assert "the job completed on every node" in proc.stderr
