"""The file systems a job needs (remote/filesystems.sh, facts/filesystems.py, checks/filesystems.py): read on real
outputs (tests/unit/data/filesystems/, README there), judged by free space, inodes, read-only and noexec; what
fills /dev/shm named; and a node program that could not be written or started explained by the file system that
stopped it, whatever the program (the core stage's facts, any program through stages/nodeprogram.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from fakes import FakeNode, is_put
from test_pipeline import first_answer
from wording import says

from clustercheck.checks import filesystems as checks
from clustercheck.facts import collect, filesystems, firstcommand
from clustercheck.inventory import Node
from clustercheck.model import Status
from clustercheck.stages import core, nodeprogram
from clustercheck.transport import UPLOAD_FAILED, CommandResult

DATA = Path(__file__).parent / "data" / "filesystems"
FULL = (DATA / "debian12-tmp-shm-full.txt").read_text()  # /tmp 16 MiB and /dev/shm 64 MiB filled, /data ro
HEALTHY = (DATA / "host-healthy.txt").read_text()
NODE = Node(name="node2", address="10.0.0.2")
# What the checked upload (transport.WRITE_CHECKED) says on a full /tmp: base64's own line, recorded with it, then
# the upload's.
UPLOAD_STDERR = "base64: write error: No space left on device\ncould not write /tmp/clustercheck-0123456789ab/x.pyz\n"


def test_the_recorded_lines_give_each_paths_space_inodes_and_mount_options():
    found = filesystems.parse(FULL)
    tmp, shm, home, data = found.paths
    assert (tmp.kind, tmp.path, tmp.total_bytes, tmp.free_bytes) == ("tmp", "/tmp", 16 << 20, 0)
    assert (shm.total_bytes, shm.free_bytes, shm.free_inodes) == (64 << 20, 0, 3085452)
    assert tmp.noexec and not tmp.read_only and home.mount == "/"
    assert data.read_only and data.free_bytes == 8 << 20
    assert filesystems.parse("clock=1\nhostname=node2\n") is None  # an older first command: nothing read


def test_what_fills_dev_shm_is_the_files_no_live_process_holds():
    found = filesystems.parse(FULL)
    dead = {s.path for s in found.dead}
    assert dead == {"/dev/shm/nccl-Y8vL1m0", "/dev/shm/nccl-Y8vL1m1", "/dev/shm/fill"}
    assert [s.path for s in found.segments if s.owned] == ["/dev/shm/torch_1234_live"]


def test_a_user_who_cannot_see_every_process_blames_only_its_own_files():
    found = filesystems.parse((DATA / "debian12-tmp-shm-full-uid1000.txt").read_text())
    assert [s.path for s in found.dead] == ["/dev/shm/fill"]  # root's live segment is not called dead


def facts(found: filesystems.Filesystems | None):
    return collect.build(NODE, {}, python="python3", python_source="default", filesystems=found)


def test_full_tmp_and_shm_fail_naming_the_path_the_figures_the_dead_segments_and_the_fix():
    finding = checks.fs_space(facts(filesystems.parse(FULL)))
    assert finding.status == Status.FAIL
    assert says(finding.message, "/tmp", "0 bytes free of 16 MiB", "/dev/shm", "0 bytes free of 64 MiB")
    assert says(finding.message, "nccl-Y8vL1m0", "24 MiB", "3 file(s) no live process")
    assert "torch_1234_live" not in finding.message  # a live job's segment is not blamed
    assert "/data" not in finding.message  # a read-only data path is read, not written: nothing wrong
    assert says(finding.fix, "free", "/tmp")


def test_a_healthy_node_passes_and_an_unread_one_is_skipped():
    assert checks.fs_space(facts(filesystems.parse(HEALTHY))).status == Status.PASS
    assert checks.shm_segments(facts(filesystems.parse(HEALTHY))).status == Status.PASS
    assert checks.fs_space(facts(None)).status == Status.SKIP


def test_a_read_only_shared_directory_fails_and_a_noexec_tmp_warns():
    line = FULL.splitlines()[3].replace("\tdata\t", "\tshared\t")  # the recorded ro mount, as --shared-dir
    found = filesystems.parse(HEALTHY + line + "\n")
    finding = checks.fs_space(facts(found))
    assert finding.status == Status.FAIL and says(finding.message, "/data", "read-only")
    noexec = filesystems.parse(HEALTHY.replace("\trw,relatime,", "\trw,noexec,relatime,", 1))  # /tmp's line, edited
    finding = checks.fs_space(facts(noexec))
    assert finding.status == Status.WARN and says(finding.message, "/tmp", "noexec", "torch.compile")


def test_dead_segments_warn_with_their_size():
    finding = checks.shm_segments(facts(filesystems.parse(FULL)))
    assert finding.status == Status.WARN and says(finding.message, "3 file(s)", "60 MiB", "nccl-Y8vL1m1")


def test_a_failed_upload_is_explained_by_the_full_file_system_it_needed():
    found = filesystems.parse(FULL)
    cause = filesystems.diagnose(found, UPLOAD_STDERR, UPLOAD_FAILED, "/tmp/clustercheck-", wrote=True)
    assert (cause.filesystem.path, cause.problem) == ("/tmp", "full")
    assert says(cause.text, "/tmp is full", "16 MiB", "0 bytes free")
    # Its exit alone (no words came back) says it was written under the work directory.
    assert filesystems.diagnose(found, "", UPLOAD_FAILED, "/tmp/clustercheck-", wrote=True).filesystem.path == "/tmp"


def test_the_words_of_a_failed_write_name_the_file_system_whatever_the_program():
    found = filesystems.parse(FULL)
    said = "OSError: [Errno 28] No space left on device: '/dev/shm/nccl-abc'"
    assert filesystems.diagnose(found, said, 1, "/tmp/clustercheck-", wrote=False).filesystem.path == "/dev/shm"
    said = "touch: cannot touch '/data/x': Read-only file system"  # recorded with the outputs
    cause = filesystems.diagnose(found, said, 1, "/tmp/clustercheck-", wrote=False)
    assert (cause.filesystem.path, cause.problem) == ("/data", "read-only") and says(cause.fix, "remount", "/data")


def test_nothing_is_blamed_without_evidence():
    full, healthy = filesystems.parse(FULL), filesystems.parse(HEALTHY)
    assert filesystems.diagnose(full, "Traceback ...\nImportError: no torch", 1, "/tmp/x", wrote=False) is None
    # The upload's other failure (the file arrived altered) on a node with room: no file system is why.
    altered = "/tmp/clustercheck-x/f arrived with SHA-256 1, not 2"
    assert filesystems.diagnose(healthy, altered, UPLOAD_FAILED, "/tmp/x", wrote=True) is None


def test_the_first_command_reads_the_file_systems_with_this_machines_shell():
    script = firstcommand.first_script("/nonexistent", paths=("data=/",))
    out = subprocess.run(["sh", "-c", script, "sh", "", "python3", "5"], capture_output=True, text=True).stdout
    found = firstcommand.parse_first(out).filesystems
    assert {"tmp", "shm", "data"} <= {f.kind for f in found.paths}
    assert all(f.total_bytes > 0 for f in found.paths)


def full_tmp_node(stderr: str) -> FakeNode:
    """node2 whose first command reads the recorded full /tmp and whose upload of the collector fails (exit 86)."""
    head, marker, swept = first_answer("node1").partition(firstcommand.LEFTOVERS_LINE)
    output = head + FULL + marker + swept + firstcommand.FACTS_LINE + "\n"  # as first_script orders its lines
    return FakeNode("node2", CommandResult(UPLOAD_FAILED, output, stderr), stream="whole")


def test_the_facts_that_could_not_be_written_name_the_full_tmp_and_its_fix():
    for stderr in (UPLOAD_STDERR, ""):
        begun = core.start(NODE, full_tmp_node(stderr), collect=["60"], collect_timeout=60)
        problem = begun.facts_problem(60)
        assert says(problem, "/tmp is full", "16 MiB", "0 bytes free", "could not be written", "exit 86")
        assert says(begun.facts_fix(), "free", "/tmp")


def test_any_node_program_that_could_not_write_is_explained_by_its_file_system():
    def node_answers(node, command):
        if command[:2] == ["sh", "-c"] and "stat -f" in command[2]:
            return CommandResult(0, FULL, "")
        return CommandResult(1, "", "Traceback ...\nOSError: [Errno 28] No space left on device: '/dev/shm/x'\n")

    answer = nodeprogram.call(FakeNode("node3", node_answers), ["python3", "-c", "x"], program="data", timeout=5)
    assert says(str(answer.failure), "node3", "data", "/dev/shm is full", "64 MiB", "free it", "exit 1")


def test_a_program_failing_for_another_reason_costs_no_extra_command():
    node = FakeNode("node3", CommandResult(1, "", "ImportError: no module named torch\n"))
    answer = nodeprogram.call(node, ["python3", "-c", "x"], program="data", timeout=5)
    assert len(node.calls) == 1 and "full" not in answer.failure.cause


def test_node_healths_own_cache_directory_is_judged_by_its_need():
    line = FULL.splitlines()[0].replace("\ttmp\t/tmp\t", "\tclustercheck\t/tmp\t")  # the full /tmp, as that class
    finding = checks.fs_space(facts(filesystems.parse(line + "\n")))
    assert finding.status == Status.FAIL and says(finding.message, "/tmp", "clustercheck's cache directory", "0 bytes")


def test_a_bundle_that_could_not_be_uploaded_names_the_full_tmp_for_any_program():
    def node_answers(node, command):
        if is_put(command):  # transport.put's checked write, on the full /tmp
            return CommandResult(UPLOAD_FAILED, "", UPLOAD_STDERR)
        if command[:2] == ["sh", "-c"] and "stat -f" in command[2]:
            return CommandResult(0, FULL, "")
        return None

    node = FakeNode("node2", node_answers, run_id="fedcba987654")
    answer = nodeprogram.bundled(node, "python3", "netprobe", timeout=5, name="netprobe mesh")
    assert says(str(answer.failure), "node2", "netprobe mesh", "/tmp is full", "16 MiB", "exit 86")
