"""The short standard-library programs of clustercheck/remote/ that the controller sends with `python -c`
(bundle.source), run here as on a node: from a directory holding a user's json.py, which must not shadow the
standard library's, and with the arguments the controller gives them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from clustercheck.stages import bundle, launch


def test_every_python_c_program_is_a_module_that_runs_without_the_working_directory_on_its_path(tmp_path):
    (tmp_path / "json.py").write_text("raise SystemExit('the user json.py was imported')\n")
    out = tmp_path / "run" / "ddp"
    out.mkdir(parents=True)
    for program in ("heartbeats", "rankcollect"):
        source = bundle.source(program)
        assert source.startswith('import sys\nif sys.path[:1] == [""]:')
        proc = subprocess.run([sys.executable, "-c", source, str(out)], cwd=tmp_path, capture_output=True, text=True)
        assert proc.returncode == 0, (program, proc.stderr)


def test_heartbeats_come_back_by_rank_with_their_age_on_the_nodes_clock(tmp_path):
    beats = tmp_path / "ddp" / "heartbeat"
    beats.mkdir(parents=True)
    (beats / "rank-0.json").write_text(json.dumps({"step": 7, "phase": "train"}))
    (beats / "rank-1.json").write_text('{"step": ')  # being written: left out
    old = time.time() - 30
    os.utime(beats / "rank-0.json", (old, old))
    command = launch.progress_command(sys.executable, str(tmp_path), "ddp")
    proc = subprocess.run(command, capture_output=True, text=True, check=True)
    got = launch.heartbeats(json.loads(proc.stdout))
    assert list(got) == ["0"]
    assert got["0"]["step"] == 7 and got["0"]["phase"] == "train"
    assert 29 <= got["0"]["age"] < 60


def test_the_python_c_programs_are_bundled_but_start_nothing_when_imported():
    for program in ("codetree", "rankcollect", "heartbeats", "bugreport"):
        proc = subprocess.run(
            [sys.executable, "-c", f"import clustercheck.remote.{program}"], capture_output=True, text=True
        )
        assert proc.returncode == 0 and proc.stdout == "", (program, proc.stderr)
