"""The slurm role on the converged Debian test cluster (slurm_enabled in testcluster-vars.yml; Slurm 22.05 from
Debian's packages, real munge, slurmctld and slurmd):
every node idle, srun on all three, the acceptance suite's Slurm tests, and the health program (clustercheck
node-health --slurm) draining a node a per-node check FAILs on, resuming it when fixed, and leaving alone a node an
administrator drained; `clustercheck run --slurm` from the controller: every stage through srun, an allocation it
makes and gives back, a node no step reaches (slurmd stopped, another MUNGE key) named with Slurm's words and fix,
a rank killed and a node frozen mid-DDP named with their node, Ctrl-C leaving nothing; and
`clustercheck launch --slurm`: the README's script as a batch job, a detached one listed, followed and stopped, and
with a spare node (--spare): a failing node left out, drained and given back, an unused spare given back; the health
program's circuit breaker and its settings per Slurm version, a check that hangs named; last, with the role's Prolog
and Epilog switched on (job_hooks), a node failing a check drained at a job's start and the job requeued, and a node
a job left a process on drained at its end. Converge, second run and check mode are test_site_playbook.py's."""

from __future__ import annotations

import base64
import contextlib
import json
import re
import shlex
import subprocess
import time

import pytest
from conftest import REPO, ansible_playbook
from harness import DDP_RANKS, HEARTBEATS, LONG_DDP, leftovers, on, pause
from test_launch import FOREVER, example_ddp_script
from test_site_playbook import acceptance, changed_tasks, inventory_with, recap

from clustercheck.exitcodes import ExitCode
from clustercheck.slurm import drain, parse

pytestmark = pytest.mark.cluster

TOOL_PYTHON = "/opt/clustercheck/tool/bin/python"  # the environment the role installs clustercheck in
INTERVAL = 10  # HealthCheckInterval while the health program is under test (the role's default is 300)


def states(controller) -> dict[str, tuple[str, str]]:
    """sinfo's view: node -> (state, reason)."""
    out = on(controller, "sinfo --noheader --Node --format='%N|%T|%E'").stdout
    return {n: (s, r) for n, s, r in (line.split("|", 2) for line in out.splitlines() if line.strip())}


def wait_for(controller, wanted, seconds: float, what: str) -> dict:
    """sinfo's states once WANTED(states) holds; fails with the last states after SECONDS."""
    deadline = time.monotonic() + seconds
    while True:
        seen = states(controller)
        if wanted(seen):
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {seconds:.0f} s; sinfo: {seen}")
        time.sleep(2)


def all_idle(seen: dict) -> bool:
    return len(seen) == 3 and all(state == "idle" for state, _ in seen.values())


@pytest.fixture(scope="module")
def slurm_cluster(converged_cluster):
    """The converged cluster with every node idle in Slurm: a node an earlier test's fault drained is resumed by its
    own health program first (it drains and resumes only with its own reason)."""
    for node in converged_cluster.nodes:
        on(node, "/usr/local/sbin/clustercheck-slurm-health", check=False)
    wait_for(converged_cluster.nodes[0], all_idle, 60, "every node idle")
    return converged_cluster


def test_every_node_is_idle_and_srun_runs_on_all_three(slurm_cluster):
    controller = slurm_cluster.nodes[0]
    out = on(controller, "timeout 120 srun --nodes=3 --ntasks-per-node=1 hostname -s").stdout
    assert sorted(out.split()) == ["node1", "node2", "node3"]
    shown = on(controller, "scontrol show node node2").stdout
    assert "CPUTot=" in shown and "Partitions=gpu" in shown


def test_the_acceptance_suite_checks_slurm(slurm_cluster, tmp_path):
    """The acceptance suite's Slurm tests, with slurm_enabled in the inventory as a user's cluster has it."""
    inventory = inventory_with(slurm_cluster, tmp_path, {"slurm_enabled": True})
    proc = acceptance(inventory, str(REPO / "tests" / "acceptance" / "test_slurm.py"))
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    passed = int(re.search(r"(\d+) passed", proc.stdout)[1])
    assert passed == 5 * 3 + 2, proc.stdout[-3000:]  # five tests on each node, two over all nodes


def test_clustercheck_runs_every_stage_through_srun_from_the_controller(slurm_cluster):
    """`salloc --nodes=3 clustercheck run --slurm` on the controller (the login node), with the clustercheck the role
    installed there: every stage reaches the nodes as job steps of the allocation, no SSH; DDP equivalence passes,
    and nothing is left in squeue or on the nodes."""
    controller = slurm_cluster.nodes[0]
    proc = on(
        controller,
        "cd /root && timeout 900 salloc --nodes=3 clustercheck run --slurm --format json --run-dir /root/srun-run "
        "--master-port 29581 > /root/srun-report.json",
        check=False,
        timeout=960,  # the command's own limit decides (a busy CI machine took 233 s, past on()'s default)
    )
    report = json.loads(on(controller, "cat /root/srun-report.json").stdout)
    results = {(r["host"] or "", r["name"]): r for r in report["checks"]}
    failed = {key: r["message"] for key, r in results.items() if r["status"] in ("FAIL", "ERROR")}
    assert proc.returncode == 0 and not failed, f"exit {proc.returncode}: {failed}\n{proc.stderr[-3000:]}"
    assert sorted(report["hosts"]) == ["node1", "node2", "node3"]
    for node in ("node1", "node2", "node3"):
        assert "srun, a step of Slurm job" in results[(node, "connect")]["message"], results[(node, "connect")]
    assert results[("", "ddp_equivalence")]["status"] == "PASS"
    assert on(controller, "squeue --noheader").stdout.strip() == ""
    assert leftovers(slurm_cluster) == {}


def test_clustercheck_asks_slurm_for_the_nodes_and_gives_them_back(slurm_cluster):
    """Outside an allocation, `--slurm --nodes=3` makes one (salloc --no-shell), runs there and cancels it; an
    allocation Slurm cannot grant is one line and exit 5."""
    controller = slurm_cluster.nodes[0]
    proc = on(
        controller,
        "cd /root && clustercheck run --slurm --nodes=3 --only core --skip 'local.*' --format json "
        "--run-dir /root/srun-alloc "
        "> /root/srun-alloc.json",
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(on(controller, "cat /root/srun-alloc.json").stdout)
    assert sorted(report["hosts"]) == ["node1", "node2", "node3"]
    assert on(controller, "squeue --noheader").stdout.strip() == ""  # given back
    refused = on(controller, "clustercheck run --slurm --nodes=4 --slurm-wait=5", check=False)
    assert refused.returncode == 5, refused.stderr
    assert refused.stderr.startswith("clustercheck: error: --slurm: Slurm can grant at most 3 of the 4 nodes asked")
    assert "--nodes 3" in refused.stderr  # read from Slurm's nodes first: no salloc, no wait
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr


def test_run_slurm_says_why_its_request_waits_and_ends_with_the_last_reason(slurm_cluster):
    """Every node held by another allocation: `run --slurm --nodes 3 --slurm-wait 8` is not refused (the nodes are
    usable, only busy), says Slurm's reason while it waits (Resources) with the job on the nodes, and ends after the
    wait, exit 5, with that reason in its error; its pending request is taken back."""
    controller = slurm_cluster.nodes[0]
    held = on(controller, "salloc --no-shell --nodes=3 --job-name=holder 2>&1").stdout
    holder = parse.granted_job(held)
    assert holder, held
    try:
        proc = on(controller, "cd /root && clustercheck run --slurm --nodes 3 --only core --slurm-wait 8", check=False)
        assert proc.returncode == 5, proc.stdout + proc.stderr
        assert re.search(rf"waits, reason \w+.*job {holder} on node\[1-3\]", proc.stderr), proc.stderr
        error = proc.stderr.strip().splitlines()[-1]
        assert "Slurm granted no allocation" in error and "within 8 s" in error and "reason" in error, error
        jobs = on(controller, "squeue --noheader --format=%i").stdout.split()
        assert jobs == [holder], jobs  # clustercheck's request is gone, the holder's stays
    finally:
        on(controller, f"scancel {holder}", check=False)
    wait_for(controller, all_idle, 60, "every node idle again")


def test_a_node_no_job_step_reaches_is_named_with_what_srun_and_slurm_say_and_slurms_fix(slurm_cluster):
    """Inside an allocation of the three nodes, node3's slurmd stopped, then (running again) node3 given a MUNGE key
    of its own: `clustercheck run --slurm --only core` names node3 in its connect check with srun's and Slurm's
    words and gives Slurm's fix (start slurmd; the cluster's MUNGE key), not SSH's; node1 and node2 are checked,
    and nothing is left behind."""
    controller, _, node3 = slurm_cluster.nodes
    granted = on(controller, "salloc --no-shell --nodes=3 --immediate=60 2>&1").stdout
    job = re.search(r"Granted job allocation (\d+)", granted)[1]
    key = on(node3, "base64 -w0 /etc/munge/munge.key").stdout.strip()

    def connect_checks(name: str) -> dict:
        on(
            controller,
            f"cd /root && SLURM_JOB_ID={job} SLURM_JOB_NODELIST='node[1-3]' clustercheck run --slurm --only core "
            f"--skip 'local.*' --format json --run-dir /root/{name} > /root/{name}.json",
            check=False,
            timeout=300,
        )
        report = json.loads(on(controller, f"cat /root/{name}.json").stdout)
        return {r["host"]: r for r in report["checks"] if r["name"] == "connect"}

    try:
        on(node3, "systemctl stop slurmd")
        stopped = connect_checks("srun-slurmd-stopped")
        on(node3, "systemctl start slurmd")
        on(node3, "dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none && systemctl restart munge")
        munge = connect_checks("srun-munge-key")
    finally:
        on(
            node3,
            f"echo {key} | base64 -d > /etc/munge/munge.key && chown munge:munge /etc/munge/munge.key && "
            "chmod 400 /etc/munge/munge.key && systemctl restart munge && systemctl restart slurmd",
            check=False,
        )
        on(controller, f"scancel {job}", check=False)
    for connect in (stopped, munge):
        assert connect["node1"]["status"] == connect["node2"]["status"] == "PASS", connect
        assert connect["node3"]["status"] == "FAIL" and "sshd" not in connect["node3"]["remediation"], connect
    said, fix = stopped["node3"]["message"], stopped["node3"]["remediation"]
    assert said.startswith(f"node3: no job step of Slurm job {job} ran there: srun: Task launch for StepId="), said
    assert "Communication connection failure: slurmd on node3 does not answer; Slurm shows it " in said, said
    assert fix.startswith("Start slurmd on node3 (systemctl start slurmd;"), fix
    said, fix = munge["node3"]["message"], munge["node3"]["remediation"]
    assert "Zero Bytes were transmitted or received" in said and "cannot authenticate each other (MUNGE)" in said
    assert fix.startswith("Give node3 the cluster's MUNGE key"), fix
    wait_for(controller, all_idle, 120, "every node idle again")
    assert on(controller, "squeue --noheader").stdout.strip() == ""
    assert leftovers(slurm_cluster) == {}


def test_clustercheck_on_a_node_reaches_the_others_over_ssh_with_the_cluster_key(slurm_cluster):
    """On the controller (the login node), `clustercheck run` over SSH authenticates with the cluster key that the
    setup named in /etc/ssh/ssh_config.d/ (no ~/.ssh/config there), as ssh does, and checks the host keys against
    the setup's /etc/ssh/ssh_known_hosts."""
    controller = slurm_cluster.nodes[0]
    assert on(controller, "test -e /root/.ssh/config", check=False).returncode != 0
    proc = on(
        controller,
        "printf 'node1\\nnode2\\nnode3\\n' > /root/nodes.ini && cd /root && "
        "clustercheck run --hosts /root/nodes.ini --only core --skip 'local.*' --format json --run-dir /root/ssh-run",
        check=False,
    )
    connect = {r["host"]: r for r in json.loads(proc.stdout)["checks"] if r["name"] == "connect"}
    assert sorted(connect) == ["node1", "node2", "node3"], proc.stderr[-2000:]
    for result in connect.values():
        assert result["status"] == "PASS" and "host key verified" in result["message"], result


@contextlib.contextmanager
def long_ddp_through_srun(cluster, command: str):
    """COMMAND (a shell line on the controller, `{clustercheck}` standing for clustercheck with a DDP job that would
    run for minutes: tests/cluster/clustercheck_long_ddp.py in the role's clustercheck environment) started in the
    background, yielded once the job's ranks train on every node; killed at the end if it still runs."""
    controller = cluster.nodes[0]
    subprocess.run(["docker", "cp", LONG_DDP, f"{controller.container}:/root/long_ddp.py"], check=True, timeout=60)
    clustercheck = f"{TOOL_PYTHON} /root/long_ddp.py 1000000"
    proc = subprocess.Popen(
        ["docker", "exec", controller.container, "sh", "-c", command.format(clustercheck=clustercheck)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            steps = [re.findall(r'"step": (\d+)', on(node, HEARTBEATS).stdout) for node in cluster.nodes]
            if all(steps) and max(int(s) for found in steps for s in found) >= 1:
                break
            time.sleep(1)
        assert proc.poll() is None, f"clustercheck ended before the DDP job ran on every node: {proc.communicate()}"
        assert time.monotonic() < deadline, "the DDP job did not run on every node within 240 s"
        yield proc
    finally:
        if proc.poll() is None:
            on(controller, "pkill -KILL -f /root/long_ddp.py", check=False)
            proc.kill()
            proc.communicate()


def test_a_rank_killed_mid_ddp_is_named_with_its_node_and_nothing_is_left(slurm_cluster):
    """A DDP rank on node2, a task of a job step, killed with SIGKILL mid-job: the torch-job runner names node2 as
    the node that failed first and stops the others' steps; the allocation ends with nothing left running."""
    controller, node2 = slurm_cluster.nodes[0], slurm_cluster.nodes[1]
    command = (
        "cd /root && timeout 600 salloc --nodes=3 {clustercheck} run --slurm --format json --skip 'local.*' "
        "--only ddp --nproc-per-node 1 --timeout 150 --master-port 29591 --run-dir /root/srun-killed"
    )
    with long_ddp_through_srun(slurm_cluster, command) as proc:
        killed = on(node2, f"for p in $({DDP_RANKS}); do kill -9 $p && echo killed $p; done").stdout
        assert "killed" in killed, killed
        stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == ExitCode.CHECK_FAILED, stderr[-3000:]
    ddp = next(r for r in json.loads(stdout)["checks"] if r["name"] == "ddp_equivalence")
    assert ddp["status"] == "FAIL" and ddp["data"]["first_failed_node"] == "node2", ddp
    assert "torchrun failed on node2 first" in ddp["message"], ddp["message"]
    assert on(controller, "squeue --noheader").stdout.strip() == ""
    assert leftovers(slurm_cluster) == {}


def test_a_node_frozen_mid_ddp_is_named_by_the_watchdog_through_srun(slurm_cluster):
    """node2 frozen (`docker pause`) while the DDP job runs through srun: the watchdog names node2 within
    --stall-timeout, says srun to it does not answer, and the job is stopped on the other nodes; once node2 thaws,
    nothing of the job runs there either."""
    controller, node2 = slurm_cluster.nodes[0], slurm_cluster.nodes[1]
    command = (
        "cd /root && timeout 600 salloc --nodes=3 {clustercheck} run --slurm --format json --skip 'local.*' "
        "--only ddp --nproc-per-node 1 --timeout 300 --stall-timeout 30 --master-port 29595 "
        "--run-dir /root/srun-frozen"
    )
    with long_ddp_through_srun(slurm_cluster, command) as proc:
        pause(node2.container)
        try:
            stdout, stderr = proc.communicate(timeout=240)
        finally:
            subprocess.run(["docker", "unpause", node2.container], check=True, timeout=60)
    assert proc.returncode == ExitCode.CHECK_FAILED, stderr[-3000:]
    ddp = next(r for r in json.loads(stdout)["checks"] if r["name"] == "ddp_equivalence")
    assert ddp["status"] == "FAIL" and ddp["data"]["first_failed_node"] == "node2", ddp
    assert re.search(r"node node2 stopped making progress .*; srun to it does not answer", ddp["message"]), ddp
    # Once node2 runs again, its slurmd ends the cancelled step's processes; the frozen run's work directory is all
    # that is left there (as over SSH: the next run removes it once that run's deadline has passed).
    workdir = f"/tmp/clustercheck-{json.loads(stdout)['run_id']}"
    deadline = time.monotonic() + 90
    try:
        while (
            leftovers(slurm_cluster) != {"node2": workdir} or on(controller, "squeue --noheader").stdout.strip()
        ) and (time.monotonic() < deadline):
            time.sleep(2)
        assert on(controller, "squeue --noheader").stdout.strip() == ""
        assert leftovers(slurm_cluster) == {"node2": workdir}
    finally:
        on(node2, "rm -rf /tmp/clustercheck-*")


def test_ctrl_c_cancels_the_allocation_clustercheck_made_and_leaves_nothing(slurm_cluster):
    """Ctrl-C (SIGINT) while the DDP job runs through srun in an allocation clustercheck asked Slurm for: exit 2,
    the job's steps and the allocation cancelled, nothing in squeue, nothing on the nodes."""
    controller = slurm_cluster.nodes[0]
    command = (
        "cd /root && {clustercheck} run --slurm --nodes=3 --format json --skip 'local.*' --only ddp "
        "--nproc-per-node 1 --timeout 300 --master-port 29593 --run-dir /root/srun-interrupted"
    )
    with long_ddp_through_srun(slurm_cluster, command) as proc:
        assert on(controller, "squeue --noheader --format=%i").stdout.strip()  # its allocation
        on(controller, f"pkill -INT -f '^{TOOL_PYTHON} /root/long_ddp.py'")
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == ExitCode.INTERRUPTED, stderr[-3000:]
    assert "clustercheck: interrupted" in stderr and "Traceback" not in stderr, stderr[-3000:]
    deadline = time.monotonic() + 30  # scancel returns before slurmctld has ended the job
    while on(controller, "squeue --noheader").stdout.strip() and time.monotonic() < deadline:
        time.sleep(1)
    assert on(controller, "squeue --noheader").stdout.strip() == ""
    assert leftovers(slurm_cluster) == {}


LAUNCH_CODE = "/root/slurm-launch"  # the code's directory, at the same path on every node as a shared home would be


def clustercheck_traceback(output: str) -> bool:
    """Whether clustercheck's own output has a traceback. What the nodes print is relayed with their name in front
    ("node2: ..."): torchrun's agents log one of their own when the agent that holds the rendezvous store exits
    first at the job's end (pytorch/pytorch#69520, seen under load with the job's exit status 0)."""
    return re.search(r"^Traceback \(most recent call last\)", output, re.M) is not None


def put_launch_code(cluster, files: dict[str, str]) -> None:
    for node in cluster.nodes:
        on(node, f"rm -rf {LAUNCH_CODE} && mkdir -p {LAUNCH_CODE}")
        for name, text in files.items():
            encoded = base64.b64encode(text.encode()).decode()
            on(node, f"echo {encoded} | base64 -d > {LAUNCH_CODE}/{name}")


def launch_on(controller, options: str, check: bool = False, timeout: float = 300):
    """`clustercheck launch --slurm OPTIONS` on the controller (the login node), in the code's directory."""
    return on(controller, f"cd {LAUNCH_CODE} && clustercheck launch --slurm {options}", check=check, timeout=timeout)


def test_launch_submits_the_readme_script_as_a_batch_job_and_exits_with_its_status(slurm_cluster):
    """`clustercheck launch --slurm --nodes=3 -- train_ddp.py` from the login node: --dry-run prints the batch script
    and submits nothing; then the job runs the preflight, the same-code check and torchrun on all three nodes as
    job steps, every rank's output streamed with its node/rank prefix, and clustercheck exits with the job's
    status; nothing is left in squeue or on the nodes. A job whose batch node lacks the run directory (no shared
    filesystem) is named with that cause (exit 6)."""
    controller = slurm_cluster.nodes[0]
    put_launch_code(slurm_cluster, {"train_ddp.py": example_ddp_script()})
    dry = launch_on(controller, "--nodes=3 --dry-run --run-dir /root/slurm-dry -- train_ddp.py --steps 5")
    assert dry.returncode == 0, dry.stderr
    assert "#SBATCH --nodes=3\n" in dry.stdout and "#SBATCH --exclusive\n" in dry.stdout, dry.stdout
    assert dry.stdout == on(controller, "cat /root/slurm-dry/launch.sbatch").stdout
    assert on(controller, "squeue --noheader").stdout.strip() == ""

    proc = launch_on(controller, "--nodes=3 --nproc-per-node 1 --run-dir /root/slurm-ddp -- train_ddp.py --steps 5")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank, node in enumerate(["node1", "node2", "node3"]):
        assert f"{node}/{rank}: rank {rank} of world size 3 on {node}" in proc.stdout, proc.stdout[-3000:]
    assert "clustercheck: preflight passed" in proc.stdout  # the launch inside the job, in the job's output
    assert re.search(r"clustercheck: Slurm job \d+ completed \(exit 0\)\n\Z", proc.stderr), proc.stderr
    assert on(controller, "squeue --noheader").stdout.strip() == ""
    assert leftovers(slurm_cluster) == {}

    unshared = launch_on(controller, "--nodelist=node2,node3 --run-dir /root/slurm-unshared -- train_ddp.py")
    assert unshared.returncode == ExitCode.NOT_STARTED, unshared.stderr
    assert "could not start its batch script on node2 (JobLaunchFailure)" in unshared.stderr, unshared.stderr
    assert "Traceback" not in unshared.stderr


def test_a_detached_batch_launch_is_listed_followed_and_stopped_and_ctrl_c_cancels_a_foreground_one(slurm_cluster):
    """`launch --slurm --detach` prints the Slurm job id; `jobs --slurm` lists it running on the three nodes, `logs
    JOB` shows every rank's prefixed output, `stop JOB` ends it (the launch inside stops every node's torchrun and
    cleans up, then the job ends). Ctrl-C on a foreground launch does the same (exit 2). Nothing is left in squeue
    or on the nodes. (Without the preflight: the other launches run it.)"""
    controller = slurm_cluster.nodes[0]
    put_launch_code(slurm_cluster, {"forever.py": FOREVER})
    detached = launch_on(
        controller,
        "--nodes=3 --nproc-per-node 1 --no-preflight --detach --run-dir /root/slurm-detached -- forever.py",
        check=True,
    )
    job = detached.stdout.strip()
    assert re.fullmatch(r"\d+", job), detached.stdout
    deadline = time.monotonic() + 120
    ticks = ["node1/0: rank 0 tick", "node2/1: rank 1 tick", "node3/2: rank 2 tick"]
    while not all(t in (logs := on(controller, f"clustercheck logs {job}", check=False)).stdout for t in ticks):
        assert time.monotonic() < deadline, f"not every rank's output within 120 s: {logs.stdout[-2000:]}{logs.stderr}"
        time.sleep(2)
    listed = on(controller, "clustercheck jobs --slurm").stdout
    assert re.search(rf"^{job}  \S+  RUNNING on node\[1-3\]$", listed, re.M), listed
    stopped = on(controller, f"clustercheck stop {job}")
    assert stopped.returncode == 0 and stopped.stdout.startswith(f"{job}: stopped on node[1-3]"), stopped
    assert on(controller, "squeue --noheader").stdout.strip() == ""
    assert leftovers(slurm_cluster) == {}

    command = (
        f"cd {LAUNCH_CODE} && exec clustercheck launch --slurm --nodes=3 --nproc-per-node 1 --no-preflight "
        "--run-dir /root/slurm-interrupted -- forever.py"
    )
    proc = subprocess.Popen(
        ["docker", "exec", controller.container, "sh", "-c", command],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while "tick" not in on(controller, "cat /root/slurm-interrupted/slurm-*.out", check=False).stdout:
            assert proc.poll() is None and time.monotonic() < deadline, "the foreground launch did not start"
            time.sleep(2)
        # The launch on the login node, not the one inside the job (whose batch script runs on node1 too); [3]
        # keeps the pattern from matching the shell that runs pkill.
        on(controller, "pkill -INT -f 'clustercheck launch --slurm --nodes=[3] .*slurm-interrupted'")
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == ExitCode.INTERRUPTED, stderr[-3000:]
    assert "clustercheck: cancelling Slurm job" in stderr and "Traceback" not in stderr, stderr[-3000:]
    # The job's last lines: the launch inside it, stopped by its SIGTERM, stopped every node's torchrun.
    assert "clustercheck: interrupted; processes started on the nodes were stopped" in stdout, stdout[-3000:]
    assert "Traceback" not in stdout, stdout[-3000:]
    assert on(controller, "squeue --noheader").stdout.strip() == ""
    assert leftovers(slurm_cluster) == {}


def squeue_empty(controller, seconds: float = 30) -> bool:
    """Whether squeue is empty within SECONDS (a job's COMPLETING ends after its last step)."""
    deadline = time.monotonic() + seconds
    while on(controller, "squeue --noheader").stdout.strip():
        if time.monotonic() > deadline:
            return False
        time.sleep(1)
    return True


def test_launch_with_a_spare_leaves_a_failing_node_out_drains_it_and_gives_it_back(slurm_cluster):
    """`salloc --nodes=3 clustercheck launch --slurm --spare 1` while node3 fails a check of its own (chrony stopped,
    in the allocation, so that node3 is in it: time.sync FAILs there): the preflight runs on all three, the job runs
    on node1 and node2 only, the output names node3 left out with time.sync, node3 is drained with the one reason
    format, the job is shrunk to node1 and node2 (Slurm 22.05 lets its user do that, and the job's later steps run
    on what is left), and nothing is left in squeue afterwards."""
    controller, _, node3 = slurm_cluster.nodes
    put_launch_code(slurm_cluster, {"train_ddp.py": example_ddp_script()})
    launch = (
        "srun --overlap --nodelist=node3 --nodes=1 --ntasks=1 systemctl stop chrony && exec clustercheck launch "
        "--slurm --spare 1 --nproc-per-node 1 --run-dir /root/slurm-spare -- train_ddp.py --steps 5"
    )
    try:
        proc = on(
            controller, f"cd {LAUNCH_CODE} && salloc --nodes=3 sh -c {shlex.quote(launch)}", check=False, timeout=600
        )
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, output[-4000:]
        for rank, node in enumerate(["node1", "node2"]):
            assert f"{node}/{rank}: rank {rank} of world size 2 on {node}" in proc.stdout, output[-4000:]
        assert " on node3" not in proc.stdout, proc.stdout[-3000:]
        assert "clustercheck: preflight: core and network checks on 3 node(s)" in output, output[-4000:]
        assert "clustercheck: preflight: the job runs on 2 of the 3 nodes: node1, node2" in output, output[-4000:]
        assert re.search(r"^clustercheck:   left out node3: time\.sync: .+; fix: ", output, re.M), output[-4000:]
        assert "clustercheck: drained node3 in Slurm: clustercheck: time.sync: " in output, output[-4000:]
        assert re.search(r"^clustercheck: gave node3 back to Slurm: job \d+ holds node1, node2 now$", output, re.M), (
            output[-4000:]
        )
        assert not clustercheck_traceback(output), output[-3000:]
        seen = states(controller)
        assert "drain" in seen["node3"][0], seen
        reason = drain.read_reason(seen["node3"][1])
        assert reason is not None and reason.check == "time.sync", seen
        resize = on(controller, "cat /root/slurm-spare/slurm_job_*_resize.sh").stdout  # Slurm's, for later steps
        assert parse.resize_environment(resize).get("SLURM_JOB_NODELIST") == "node[1-2]", resize
        assert squeue_empty(controller), on(controller, "squeue").stdout
        assert leftovers(slurm_cluster) == {}
    finally:
        on(node3, "systemctl start chrony", check=False)
        deadline = time.monotonic() + 90
        while not all_idle(states(controller)) and time.monotonic() < deadline:
            on(node3, "clustercheck node-health --slurm", check=False)  # resumes its drain once chrony synchronized
            time.sleep(2)
        on(controller, "scontrol update nodename=node3 state=resume", check=False)
    wait_for(controller, all_idle, 60, "every node idle again")


def test_a_batch_launch_with_a_spare_starts_while_an_administrator_has_a_node_drained_and_names_it(slurm_cluster):
    """`clustercheck launch --slurm --nodes=2 --spare 1` from the login node while node3 is drained by an
    administrator: the launch reads Slurm's nodes first, names node3 with Slurm's reason and asks for two to three
    nodes, so the job starts on node1 and node2 instead of waiting for node3; the launch inside says the spare it
    did not get."""
    controller = slurm_cluster.nodes[0]
    put_launch_code(slurm_cluster, {"train_ddp.py": example_ddp_script()})
    on(controller, "scontrol update nodename=node3 state=drain reason='PSU swap, ticket 7'")
    try:
        proc = launch_on(
            controller,
            "--nodes=2 --spare 1 --nproc-per-node 1 --run-dir /root/slurm-spare-drained -- train_ddp.py --steps 5",
        )
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, output[-4000:]
        for rank, node in enumerate(["node1", "node2"]):
            assert f"{node}/{rank}: rank {rank} of world size 2 on {node}" in proc.stdout, output[-4000:]
        first = re.search(r"^clustercheck: --spare 1: 2 usable node\(s\) in the cluster .*$", output, re.M)
        assert first and "node3" in first[0] and "PSU swap, ticket 7" in first[0], output[-4000:]
        assert "asking Slurm for 2 to 3 nodes" in first[0], output[-4000:]
        script = on(controller, "cat /root/slurm-spare-drained/launch.sbatch").stdout
        assert "#SBATCH --nodes=2-3\n" in script, script
        said = re.search(r"^clustercheck: Slurm granted 2 node\(s\) of the 2-3 asked: 0 of 1 spare.*$", output, re.M)
        assert said and "node3" in said[0] and "DRAIN" in said[0] and "PSU swap, ticket 7" in said[0], output[-4000:]
        assert not clustercheck_traceback(output), output[-3000:]
        assert squeue_empty(controller), on(controller, "squeue").stdout
    finally:
        on(controller, "scontrol update nodename=node3 state=resume", check=False)
    wait_for(controller, all_idle, 60, "every node idle again")


def test_a_batch_launch_with_a_spare_runs_on_the_nodes_asked_and_gives_the_unused_spare_back(slurm_cluster):
    """`clustercheck launch --slurm --nodes=2 --spare 1` from the login node, every node healthy: the batch job asks
    three nodes, the launch inside it runs the job on the first two and says the third was a spare not needed, and
    gives it back to Slurm (the batch node, node1, is one of the two kept)."""
    controller = slurm_cluster.nodes[0]
    put_launch_code(slurm_cluster, {"train_ddp.py": example_ddp_script()})
    proc = launch_on(
        controller, "--nodes=2 --spare 1 --nproc-per-node 1 --run-dir /root/slurm-spare-batch -- train_ddp.py --steps 5"
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "#SBATCH --nodes=3\n" in on(controller, "cat /root/slurm-spare-batch/launch.sbatch").stdout
    for rank, node in enumerate(["node1", "node2"]):
        assert f"{node}/{rank}: rank {rank} of world size 2 on {node}" in proc.stdout, output[-4000:]
    assert "clustercheck:   left out node3: spare, not needed" in proc.stdout, output[-4000:]
    assert re.search(r"^clustercheck: gave node3 back to Slurm: job \d+ holds node1, node2 now$", output, re.M), output[
        -4000:
    ]
    assert not clustercheck_traceback(output), output[-3000:]
    assert squeue_empty(controller), on(controller, "squeue").stdout
    assert leftovers(slurm_cluster) == {}
    wait_for(controller, all_idle, 60, "every node idle again")


def test_a_failing_check_drains_the_node_fixing_it_resumes_it_and_an_admins_drain_stays(slurm_cluster, wheelhouse):
    controller, node2, node3 = slurm_cluster.nodes
    key_before = on(controller, "sha256sum /etc/munge/munge.key").stdout.split()[0]
    # node3 gets a munge key of its own (as a reinstalled node has): the role gives it the cluster's again, unseen.
    on(node3, "dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none && systemctl restart munge")
    proc = ansible_playbook(
        slurm_cluster, wheelhouse, "--tags", "slurm", "--diff", "-v", "-e", f"slurm_health_check_interval={INTERVAL}"
    )
    try:
        assert proc.returncode == 0, proc.stdout[-4000:]
        changed = changed_tasks(proc.stdout)
        assert any("Reconfigure Slurm" in task for task in changed), changed  # a new interval is a reconfigure ...
        assert not any("Restart Slurm" in task for task in changed), changed  # ... not a restart
        assert any("munge key" in task and "node3" in task for task in changed), changed
        assert set(recap(proc.stdout)) == {"node1", "node2", "node3"}
        key = on(controller, "base64 -w0 /etc/munge/munge.key").stdout.strip()
        raw = base64.b64decode(key)
        for shown in (key, key[:24], raw.hex()[:32]):
            assert shown not in proc.stdout + proc.stderr, "the munge key appears in Ansible's output"
        for node in slurm_cluster.nodes:
            assert on(node, "sha256sum /etc/munge/munge.key").stdout.split()[0] == key_before

        on(node2, "systemctl stop chrony")  # a per-node check FAILs: time.sync
        seen = wait_for(
            controller, lambda s: "drain" in s["node2"][0], 3 * INTERVAL + 30, "node2 drained by its health program"
        )
        assert seen["node2"][1].startswith("clustercheck: time.sync: "), seen["node2"]
        assert seen["node1"][0] == seen["node3"][0] == "idle", seen

        on(node2, "systemctl start chrony")
        wait_for(controller, lambda s: s["node2"][0] == "idle", 3 * INTERVAL + 60, "node2 resumed once chrony runs")

        on(controller, "scontrol update nodename=node3 state=drain reason='disk swap'")
        time.sleep(3 * INTERVAL)  # three health runs on a healthy node3
        seen = states(controller)
        assert "drain" in seen["node3"][0] and seen["node3"][1] == "disk swap", seen
    finally:
        on(node2, "systemctl start chrony", check=False)
        on(controller, "scontrol update nodename=node3 state=resume", check=False)
        restored = ansible_playbook(slurm_cluster, wheelhouse, "--tags", "slurm")
        assert restored.returncode == 0, restored.stdout[-3000:]
    wait_for(controller, all_idle, 60, "every node idle again")


def test_a_check_failing_on_every_node_drains_one_and_the_breaker_says_why_for_the_rest(slurm_cluster):
    """chrony stopped on every node (time.sync FAILs everywhere at once, as an NTP server down makes it): node-health
    --slurm with the role's limit (10 % of the partition, at least one node), run on each node in turn, drains the
    first and holds the others' drains back, saying why and writing clustercheck_slurm_drain_withheld; once chrony
    runs again, the drained node is resumed."""
    controller = slurm_cluster.nodes[0]
    program = on(controller, "cat /usr/local/sbin/clustercheck-slurm-health").stdout
    assert "--max-drained-percent 10 \\\n    --max-drained-nodes 1 " in program, program  # the role's default limit
    run = "clustercheck node-health --slurm --max-drained-percent 10 --max-drained-nodes 1 --textfile-dir /root/breaker"
    said = {}
    try:
        for node in slurm_cluster.nodes:
            on(node, "systemctl stop chrony && rm -rf /root/breaker && mkdir /root/breaker")
        for node in slurm_cluster.nodes:
            said[node.name] = on(node, run, check=False)
        seen = states(controller)
        drained = [name for name, (state, _) in seen.items() if "drain" in state]
        assert len(drained) == 1 and seen[drained[0]][1].startswith("clustercheck: time.sync: "), seen
        for node in slurm_cluster.nodes:
            proc = said[node.name]
            assert proc.returncode == ExitCode.CHECK_FAILED, proc.stderr
            if node.name in drained:
                continue
            assert re.search(
                rf"^clustercheck: not draining {node.name} for time\.sync: clustercheck holds 1 of the 3 nodes of "
                rf"partition gpu drained already \({drained[0]}\), the most it may \(10 % of its nodes, at least 1\)",
                proc.stderr,
                re.M,
            ), proc.stderr
            metric = on(node, "cat /root/breaker/clustercheck_node_health.prom").stdout
            withheld = (
                f'clustercheck_slurm_drain_withheld{{check="time.sync",host="{node.name}",source="node-health"}} 1'
            )
            assert withheld in metric, metric
    finally:
        for node in slurm_cluster.nodes:
            on(node, "systemctl start chrony; rm -rf /root/breaker", check=False)
        deadline = time.monotonic() + 90
        while not all_idle(states(controller)) and time.monotonic() < deadline:
            for node in slurm_cluster.nodes:  # resumed once chrony has synchronized again
                on(node, "clustercheck node-health --slurm", check=False)
            time.sleep(2)
    wait_for(controller, all_idle, 10, "every node idle again")


def test_the_health_checks_settings_fit_the_installed_slurm(slurm_cluster, wheelhouse):
    """Slurm 22.05 (Debian 12): the health program fits its deadlines in the role's 60 s (--budget 50), slurm.conf has
    no HealthCheckTimeout (26.05 adds it), and a HealthCheckNodeState value 22.05 does not know (START_ONLY, of
    25.11) stops the role in check mode, naming the version and the values it knows, before anything changes."""
    controller = slurm_cluster.nodes[0]
    assert "--budget 50 " in on(controller, "cat /usr/local/sbin/clustercheck-slurm-health").stdout
    conf = on(controller, "cat /etc/slurm/slurm.conf").stdout
    assert "HealthCheckNodeState=ANY,CYCLE\n" in conf and "HealthCheckTimeout" not in conf, conf
    proc = ansible_playbook(
        slurm_cluster, wheelhouse, "--tags", "slurm", "--check", "-e", "slurm_health_check_node_state=IDLE,START_ONLY"
    )
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert (
        "slurm_health_check_node_state IDLE,START_ONLY: Slurm 22.05 does not know START_ONLY (it knows ALLOC, ANY, "
        "CYCLE, IDLE, MIXED)" in proc.stdout
    ), proc.stdout[-3000:]


def test_a_check_that_hangs_is_named_and_drains_its_node_within_the_health_programs_time(slurm_cluster):
    """/etc/nccl.conf made a FIFO on node3: reading it never returns, as a read on a hung mount does, and no signal
    ends it. The health program slurmd runs (its --budget 50) gives the probe up at its share of the time, FAILs the
    check that reads it (env.launch) by name and drains node3 with that reason, all in well under Slurm's 60 s,
    instead of being killed by slurmd with nothing said. With the file back, the health program resumes node3."""
    controller, node3 = slurm_cluster.nodes[0], slurm_cluster.nodes[2]
    on(node3, "mv /etc/nccl.conf /root/nccl.conf.kept && mkfifo /etc/nccl.conf")
    try:
        started = time.monotonic()
        proc = on(node3, "/usr/local/sbin/clustercheck-slurm-health", check=False, timeout=90)
        took = time.monotonic() - started
        seen = states(controller)
        assert seen["node3"][0] == "drained", (seen, proc.stdout, proc.stderr)
        assert seen["node3"][1].startswith("clustercheck: env.launch: hung: launch_files gave no answer within "), seen
        assert took < 40, f"the health program took {took:.0f} s"
    finally:
        on(node3, "rm -f /etc/nccl.conf && mv /root/nccl.conf.kept /etc/nccl.conf", check=False)
        on(node3, "/usr/local/sbin/clustercheck-slurm-health", check=False)
    wait_for(controller, all_idle, 30, "every node idle again")


@pytest.fixture(scope="module")
def job_hooks(slurm_cluster, wheelhouse):
    """The Slurm cluster with clustercheck's Prolog and Epilog switched on by the role (slurm_prolog_enabled,
    slurm_epilog_enabled: opt-in, off in the shared test variables, where every job would wait for them), and off
    again afterwards. The tests that use it come last in this module."""
    enabled = ansible_playbook(
        slurm_cluster,
        wheelhouse,
        "--tags",
        "slurm",
        "-e",
        "slurm_prolog_enabled=true",
        "-e",
        "slurm_epilog_enabled=true",
    )
    assert enabled.returncode == 0, enabled.stdout[-3000:]
    conf = on(slurm_cluster.nodes[0], "cat /etc/slurm/slurm.conf").stdout
    assert "Prolog=/usr/local/sbin/clustercheck-slurm-prolog\n" in conf, conf
    assert "Epilog=/usr/local/sbin/clustercheck-slurm-epilog\n" in conf, conf
    yield slurm_cluster
    restored = ansible_playbook(slurm_cluster, wheelhouse, "--tags", "slurm")
    assert restored.returncode == 0, restored.stdout[-3000:]
    conf = on(slurm_cluster.nodes[0], "cat /etc/slurm/slurm.conf").stdout
    assert "Prolog=" not in conf and "Epilog=" not in conf, conf


def test_the_prolog_drains_a_node_that_fails_a_check_and_slurm_requeues_the_job(job_hooks):
    """chrony stopped on node2 (time.sync FAILs there): a batch job sent to node2 never starts: the Prolog drains
    node2 with the reason `clustercheck: time.sync: ...` (Slurm keeps ours) and fails, and slurmd requeues the job,
    held. A job on a healthy node starts through the same Prolog and runs. Once chrony runs, the health program
    resumes node2 (its drain is clustercheck's)."""
    controller, node2 = job_hooks.nodes[0], job_hooks.nodes[1]
    assert on(controller, "cd /tmp && timeout 60 srun --nodelist=node3 --nodes=1 hostname -s").stdout.strip() == "node3"
    job = None
    try:
        on(node2, "systemctl stop chrony")
        job = on(controller, "cd /tmp && sbatch --parsable --nodelist=node2 --nodes=1 --wrap 'hostname -s'").stdout
        job = job.strip().split(";")[0]
        seen = wait_for(controller, lambda s: "drain" in s["node2"][0], 60, "node2 drained by the Prolog")
        assert seen["node2"][1].startswith("clustercheck: time.sync: the clock is not synchronized: "), seen
        deadline = time.monotonic() + 30
        while True:
            shown = on(controller, f"squeue --noheader --jobs {job} --format='%T|%r'").stdout.strip()
            if shown == "PENDING|launch failed requeued held" or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert shown == "PENDING|launch failed requeued held", shown
        said = on(node2, "journalctl -t clustercheck-slurm-prolog --no-pager", check=False).stdout
        assert "drained node2 in Slurm: clustercheck: time.sync: " in said, said
    finally:
        if job:
            on(controller, f"scancel {job}", check=False)
        on(node2, "systemctl start chrony", check=False)
        deadline = time.monotonic() + 90
        while "drain" in states(controller)["node2"][0] and time.monotonic() < deadline:
            on(node2, "/usr/local/sbin/clustercheck-slurm-health", check=False)  # resumed once chrony is synchronized
            time.sleep(2)
    wait_for(controller, all_idle, 60, "every node idle again")


def test_the_epilog_drains_a_node_where_a_job_left_a_process_of_its_user(job_hooks):
    """slurm_epilog_enabled (job_hooks): a user's process that outlives the user's job on node2 (started
    beside the job, as a job's daemonized process is) is found by the Epilog when the job ends, and node2 is drained
    with the reason `clustercheck: epilog.processes: ...` naming the user, the job and the process; the other nodes
    stay idle. Once the process is gone, node-health --slurm resumes node2 (the drain is clustercheck's)."""
    controller, node2 = job_hooks.nodes[0], job_hooks.nodes[1]
    user = "ccepilog"
    assert "Epilog=/usr/local/sbin/clustercheck-slurm-epilog\n" in on(controller, "cat /etc/slurm/slurm.conf").stdout
    try:
        for node in job_hooks.nodes:
            on(node, f"useradd --uid 4343 --no-create-home --shell /bin/sh {user}")
        on(node2, f"su {user} -c 'setsid sleep 600 </dev/null >/dev/null 2>&1 &'")
        on(controller, f"cd /tmp && su {user} -c 'srun --nodelist=node2 --nodes=1 true'", timeout=120)
        try:
            seen = wait_for(controller, lambda s: "drain" in s["node2"][0], 60, "node2 drained by the Epilog")
        except AssertionError as exc:
            said = on(node2, "journalctl -t clustercheck-slurm-epilog --no-pager | tail -20", check=False).stdout
            raise AssertionError(f"{exc}\nthe Epilog said: {said}") from None
        reason = seen["node2"][1]
        assert re.match(
            rf"clustercheck: epilog\.processes: 1 process\(es\) of {user} left after job \d+: \d+ sleep", reason
        )
        assert seen["node1"][0] == seen["node3"][0] == "idle", seen
    finally:
        on(node2, f"pkill -KILL -u {user}", check=False)
        for node in job_hooks.nodes:
            on(node, f"userdel {user}", check=False)
        on(node2, "clustercheck node-health --slurm", check=False)  # resumes node2: its drain is clustercheck's
    wait_for(controller, all_idle, 60, "every node idle again")
