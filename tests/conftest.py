"""Shared fixtures: the Docker test cluster and the torch wheelhouse for offline nodes."""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import nodeimages
import pytest
import testcluster
import torchenv
import yaml

REPO = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() == "true"
TORCH_PIN = torchenv.TORCH_PIN
# The Debian test cluster registers its environment as a Jupyter kernel (testcluster-vars.yml): ipykernel at the
# role's pinned version, and its dependencies, come from the same wheelhouse.
IPYKERNEL_PIN = "ipykernel=={}".format(
    yaml.safe_load((REPO / "roles" / "python_env" / "defaults" / "main.yml").read_text())[
        "python_env_ipykernel_version"
    ]
)


def _need_docker() -> None:
    """Outside CI, no Docker means the multi-node tests are skipped; in CI it is a failure."""
    try:
        testcluster.ensure_docker(start=os.geteuid() == 0)
    except testcluster.ClusterError as exc:
        if IN_CI:
            pytest.fail(f"the test cluster needs Docker, and CI must run the multi-node tests: {exc}")
        pytest.skip(f"no Docker engine: {exc}")


# The pytest-xdist worker this process is ("-gw0"), or "" in a run without workers.
_LANE = f"-{os.environ['PYTEST_XDIST_WORKER']}" if os.environ.get("PYTEST_XDIST_WORKER") else ""


@contextlib.contextmanager
def own_cluster(
    size: int, what: str, suffix: str = "", os_name=testcluster.DEFAULT_OS, user: str = "root", image=None, rails=0
):
    """SIZE fresh nodes under the name TESTCLUSTER_NAME (default cc) + SUFFIX, removed afterwards.

    TESTCLUSTER_NAME names the cluster, so separate checkouts can test side by side; a pytest-xdist worker adds
    its own name (-gw1), so two lanes never share a cluster by accident. OS_NAME and USER as for testcluster.up:
    one OS or one per node; the login user (passwordless sudo) when not root. IMAGE: a function that returns the
    image to start the nodes from instead of OS_NAME's (testcluster.up's image), called once Docker answers. RAILS:
    data networks besides the cluster network (testcluster.up's).
    """
    _need_docker()
    name = os.environ.get("TESTCLUSTER_NAME", testcluster.DEFAULT_NAME) + _LANE + suffix
    try:
        up = testcluster.up(size, name=name, os_name=os_name, user=user, image=image() if image else "", rails=rails)
    except testcluster.ClusterError as exc:
        pytest.fail(f"{what} did not come up: {exc}")
    try:
        yield up
    finally:
        testcluster.down(name)


# --------------------------------------------------------------------------- the test clusters, by state

# A test asks for the state its nodes must be in by the fixture it takes, and gets that state whatever ran before it:
#
#   bare_cluster              3 Debian 12 nodes as `testcluster up` leaves them: nothing of clustercheck's there
#   torch_cluster             3 Debian 12 nodes with torch in /opt/clustercheck/venv (torchenv.py), nothing else
#   converged_cluster         3 Debian 12 nodes after site.yml: chrony, /etc/hosts, firewall, SSH trust, Slurm, torch
#   ubuntu_cluster            one node per Ubuntu release, reached as `ops`: bare
#   converged_ubuntu_cluster  one node per Ubuntu release after site.yml
#
# Each state is a cluster of its own, made once in each lane that runs a test asking for it (its name carries the
# lane's and the state's: cc-gw0-torch), and set up by its own fixture only: no fixture takes another's nodes on to
# its state. A test that changes a node puts it back; one that finds it could not calls `spoil`, and every later
# test that asks for that cluster fails, naming what spoiled it, instead of running on nodes in another state.
STATES = ("bare_cluster", "torch_cluster", "converged_cluster", "ubuntu_cluster", "converged_ubuntu_cluster")
UBUNTU_RELEASES = ["ubuntu20.04", "ubuntu22.04", "ubuntu24.04"]
UBUNTU_USER = "ops"


@pytest.fixture(scope="session")
def bare_cluster():
    """Three fresh Debian 12 nodes on a private network, reached over SSH as root; removed afterwards."""
    with own_cluster(3, "bare test cluster") as up:
        yield up


@pytest.fixture(scope="session")
def torch_cluster(wheelhouse):
    """Three fresh Debian 12 nodes with torch 2.13.0 (CPU) in /opt/clustercheck/venv, recorded in
    /etc/clustercheck/python, as a site without Ansible sets it up (torchenv.py: the nodes start from a node image
    with it, built once), and nothing of site.yml: no firewall, chrony, /etc/hosts entries or Slurm."""
    with own_cluster(3, "torch test cluster", "-torch", image=lambda: torchenv.node_image(wheelhouse)) as up:
        errors = torchenv.install(up, wheelhouse)  # installs nothing where torch imports: it proves that
        if errors:
            pytest.fail("installing the torch environment on the nodes failed: " + "; ".join(errors))
        yield up


@pytest.fixture(scope="session")
def converged_cluster(wheelhouse):
    """Three fresh Debian 12 nodes after one run of site.yml with the test variables, as users check a cluster:
    chrony (node1 serving), /etc/hosts, firewall, SSH trust, Slurm, Docker (masked), and a venv with torch recorded in
    /etc/clustercheck/python. The run's output and duration are on it as `converge_output` and `converge_seconds`.
    Two data networks ("rails", eth1 and eth2) besides the cluster network, named in cluster_rail_interfaces: the
    torch jobs bind local rank i to rail i, and the firewall role lets them in."""
    with own_cluster(3, "converged test cluster", "-site", rails=2) as up:
        converge(up, wheelhouse)
        yield up


@pytest.fixture(scope="session")
def ubuntu_cluster():
    """One fresh node of each Ubuntu release (node1: 20.04, node2: 22.04, node3: 24.04), reached as the non-root user
    `ops` with passwordless sudo, the way cloud images are; removed afterwards."""
    with own_cluster(3, "Ubuntu test cluster", "-ubuntu", os_name=UBUNTU_RELEASES, user=UBUNTU_USER) as up:
        yield up


@pytest.fixture(scope="session")
def converged_ubuntu_cluster(wheelhouse):
    """One node of each Ubuntu release as on `ubuntu_cluster` (20.04, 22.04, 24.04, user `ops` with become), after one
    run of site.yml; output and duration as on `converged_cluster`."""
    name, releases = "converged Ubuntu test cluster", UBUNTU_RELEASES
    with own_cluster(3, name, "-ubuntu-site", os_name=releases, user=UBUNTU_USER) as up:
        converge(up, wheelhouse)
        yield up


def spoil(cluster, why: str) -> None:
    """CLUSTER is no longer in the state its fixture promises, for WHY (what left it so): every later test that asks
    for it fails with WHY instead of running on it."""
    cluster.spoiled = why


@pytest.fixture(autouse=True)
def cluster_in_its_state(request):
    """A test that asks for a cluster someone spoiled (see `spoil`) fails before it starts, saying who."""
    for name in STATES:
        if name in request.fixturenames:
            why = getattr(request.getfixturevalue(name), "spoiled", "")
            if why:
                pytest.fail(f"{name} is not in its state: {why}", pytrace=False)


@pytest.fixture(scope="session")
def wheelhouse() -> Path:
    """A directory of wheels with torch (CPU build) and its dependencies, built on the control machine.

    Nodes cannot reach PyPI, like an air-gapped site: they install from this directory with --no-index.
    """
    return build_wheelhouse()


def build_wheelhouse() -> Path:
    """The torch and ipykernel wheelhouse (the `wheelhouse` fixture), built once for test sessions and benchmarks."""
    target = testcluster.CACHE_DIR / "wheelhouse-torch-numpy-ipykernel"
    stamp = target / ".complete"
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".wheelhouse.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time across test sessions
        numpy_pin = "numpy=={}".format(
            yaml.safe_load((REPO / "roles" / "python_env" / "defaults" / "main.yml").read_text())[
                "python_env_numpy_version"
            ]
        )
        pins = [TORCH_PIN, IPYKERNEL_PIN, numpy_pin]
        if stamp.exists() and stamp.read_text().split() == pins:
            return target
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        pip = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(target)]
        subprocess.run([*pip, "-c", str(REPO / "constraints.txt"), TORCH_PIN, IPYKERNEL_PIN], check=True)
        # The role's numpy, which the nodes install with torch (not the control machine's pin in constraints.txt).
        subprocess.run([*pip, "--no-deps", numpy_pin], check=True)
        stamp.write_text(" ".join(pins) + "\n")
    return target


@pytest.fixture(scope="session")
def lightning_wheelhouse(wheelhouse) -> Path:
    """Lightning and its dependencies (pinned in constraints.txt), downloaded like the torch wheelhouse; the wheels
    the torch wheelhouse already has (torch itself) are left out, so nodes install from both directories."""
    target = testcluster.CACHE_DIR / "wheelhouse-lightning"
    stamp = target / ".complete"
    with open(target.parent / ".wheelhouse-lightning.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text().strip() == torchenv.LIGHTNING_PIN:
            return target
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        pip = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(target)]
        subprocess.run(
            [*pip, "-c", str(REPO / "constraints.txt"), "--find-links", str(wheelhouse), torchenv.LIGHTNING_PIN],
            check=True,
        )
        for wheel in target.glob("*.whl"):
            if (wheelhouse / wheel.name).exists():
                wheel.unlink()
        stamp.write_text(torchenv.LIGHTNING_PIN + "\n")
    return target


# --------------------------------------------------------------------------- Ansible

ACCEPTANCE_DIR = REPO / "tests" / "acceptance"
TEST_VARS = REPO / "tests" / "ansible" / "testcluster-vars.yml"
UBUNTU_HOST_VARS = REPO / "tests" / "ansible" / "testcluster-ubuntu-hostvars.yml"


def write_ubuntu_host_vars(cluster, wheelhouse: Path) -> None:
    """host_vars/<node>.yml beside CLUSTER's inventory from testcluster-ubuntu-hostvars.yml, by each node's
    release: Ansible and the acceptance suite (through ansible-inventory) read the same values."""
    by_release = yaml.safe_load(UBUNTU_HOST_VARS.read_text())
    pure = str(pure_wheelhouse(wheelhouse))
    host_vars = Path(cluster.inventory).parent / "host_vars"
    host_vars.mkdir(exist_ok=True)
    for node in cluster.nodes:
        values = {k: pure if v == "PURE_WHEELHOUSE" else v for k, v in by_release.get(node.os, {}).items()}
        (host_vars / f"{node.name}.yml").write_text(yaml.safe_dump(values, sort_keys=True))


def pure_wheelhouse(wheelhouse: Path) -> Path:
    """A wheelhouse with only pure-Python wheels (mpmath, filelock) from WHEELHOUSE: for the Ubuntu nodes whose
    Python no torch wheel here fits."""
    target = wheelhouse.parent / "wheelhouse-pure"
    target.mkdir(exist_ok=True)
    for wheel in [*wheelhouse.glob("mpmath-*-py3-none-any.whl"), *wheelhouse.glob("filelock-*-py3-none-any.whl")]:
        if not (target / wheel.name).exists():
            shutil.copy2(wheel, target / wheel.name)
    return target


def pytest_ignore_collect(collection_path, config):
    """tests/acceptance/ runs against a real inventory (--hosts=...), never in the plain run."""
    if collection_path == ACCEPTANCE_DIR and not config.getoption("hosts", default=None):
        return True
    return None


def ansible_playbook(cluster, wheelhouse: Path, *args: str, timeout: float = 1500) -> subprocess.CompletedProcess:
    """Run site.yml (or the playbook in ARGS) against CLUSTER with the test variables: venv + wheelhouse,
    time served by node1 inside the test network; on Ubuntu nodes also testcluster-ubuntu-vars.yml."""
    if any(testcluster.distro(n.os).ubuntu for n in cluster.nodes):
        write_ubuntu_host_vars(cluster, wheelhouse)
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", cluster.inventory, "-e", f"@{TEST_VARS}"]
    cmd += ["-e", f"pytorch_wheelhouse={wheelhouse}", *args]
    if not any(a.endswith(".yml") and not a.startswith("@") for a in args):
        cmd.append(str(REPO / "site.yml"))
    env = {**os.environ, "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1", "ANSIBLE_STDOUT_CALLBACK": "default"}
    # A busy 2-core machine can take more than Ansible's default 10 s to answer a new SSH connection.
    env.setdefault("ANSIBLE_TIMEOUT", "60")
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


def converge(cluster, wheelhouse: Path) -> None:
    """site.yml on CLUSTER with the test variables, its output and duration kept on CLUSTER (`converge_output`,
    `converge_seconds`); a failed run fails the fixture that asked for it, with the run's last lines."""
    started = time.monotonic()
    try:
        proc = ansible_playbook(cluster, wheelhouse)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        pytest.fail(
            f"site.yml did not finish on the test cluster {cluster.name} within {exc.timeout:.0f} s:\n{out[-6000:]}"
        )
    cluster.converge_seconds = time.monotonic() - started
    cluster.converge_output = proc.stdout
    if proc.returncode != 0:
        out = f"{proc.stdout[-6000:]}\n{proc.stderr}"
        pytest.fail(f"site.yml failed on the test cluster {cluster.name} (exit {proc.returncode}):\n{out}")


# --------------------------------------------------------------------------- lanes

# pyproject's addopts run the tests in two lanes (pytest-xdist: --numprocesses=2). A cluster is made once in each
# lane that runs a test asking for it, so the tests on one cluster go to one lane as one group (the group is the
# state's fixture); a module's own cluster makes its module a group; the localhost tests are one group (they bind fixed
# ports on this machine); everything else is spread test by test. A run lasts as long as its longest lane, so the
# groups are handed out the costliest first, by the minutes each takes, roughly (LANE_MINUTES: in the clean-clone run
# of 2026-11-29, 64 minutes in all, the converged_cluster group took about 53 in its lane, 11 of them fault rows that
# need nothing of site.yml and now run on the torch cluster), each to whichever lane is free first. The workers order
# their collection so (the scheduler hands out the groups in collection order) and write the groups down; the
# controller's scheduler reads them.
LANE_MINUTES = {
    "converged_cluster": 42,
    "torch_cluster": 23,
    "converged_ubuntu_cluster": 15,
    "tests/ansible/test_nvidia_standins.py": 10,
    "localhost": 6,
    "tests/ansible/test_nvidia_ubuntu_source.py": 6,
    "bare_cluster": 5,
    "tests/cluster/test_scale.py": 5,
    "ubuntu_cluster": 3,
    "tests/cluster/test_container_image.py": 3,
    "tests/ansible/test_ubuntu_nodes.py": 2,
}
LANE_GROUPS = pytest.StashKey[Path]()


def lane_group(item) -> str | None:
    """The group ITEM runs in, or None for a test any worker can take alone."""
    group = next((fixture for fixture in STATES if fixture in item.fixturenames), None)
    if group is None and item.get_closest_marker("cluster"):
        group = item.path.relative_to(REPO).as_posix()
    if group is None and item.path.is_relative_to(REPO / "tests" / "local"):
        group = "localhost"
    return group


def lane_cost(group: str) -> float:
    """GROUP's minutes, roughly; a group LANE_MINUTES does not have (a new one) counts as a cluster module's."""
    return LANE_MINUTES.get(group, 1.0 if group.startswith("tests/") else 0.0)


def pytest_addoption(parser, pluginmanager):
    """With pytest-xdist off (-p no:xdist) or not installed, the lanes' options in pyproject's addopts are accepted
    and mean what `-n 0` means: every test in this one process."""
    if pluginmanager.is_blocked("xdist") or importlib.util.find_spec("xdist") is None:
        group = parser.getgroup("lanes", "lanes (pytest-xdist is off: every test runs in this process)")
        group.addoption("--numprocesses", dest="numprocesses", default=None, help="ignored without pytest-xdist")
        group.addoption("--dist", dest="dist", default="no", help="ignored without pytest-xdist")


def _lanes(config) -> bool:
    return config.pluginmanager.has_plugin("xdist") and bool(config.getoption("numprocesses", default=None))


def pytest_configure(config):
    if _lanes(config) and not hasattr(config, "workerinput"):
        config.stash[LANE_GROUPS] = Path(tempfile.mkdtemp(prefix="clustercheck-lanes-")) / "groups.json"


def pytest_unconfigure(config):
    groups = config.stash.get(LANE_GROUPS, None)
    if groups is not None:
        shutil.rmtree(groups.parent, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """(controller) Where each worker writes the groups it collected."""
    node.workerinput["lane_groups"] = str(node.config.stash[LANE_GROUPS])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """(controller) Whole groups to one worker at a time, in the order of the workers' collection (the costliest
    first), with the groups the workers wrote; a test in none is a group of its own."""
    from xdist.scheduler import LoadScopeScheduling

    path = config.stash[LANE_GROUPS]
    config.option.loadscopereorder = False  # xdist's own order is by number of tests

    class LaneScheduling(LoadScopeScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                self.groups = json.loads(path.read_text())
            return self.groups.get(nodeid, nodeid)

    return LaneScheduling(config, log)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """(worker) The collection in lane order: the costliest group first, each group's tests together in the order
    they were collected (tests/ansible/test_ubuntu_nodes.py runs its tests in file order, for one)."""
    if not hasattr(config, "workerinput"):
        return
    groups = {item.nodeid: lane_group(item) for item in items}
    first = {}
    for index, item in enumerate(items):
        first.setdefault(groups[item.nodeid] or item.nodeid, index)
    items.sort(key=lambda i: (-lane_cost(groups[i.nodeid] or ""), first[groups[i.nodeid] or i.nodeid]))
    # Written here, not in pytest_collection_finish: xdist's worker tells the controller its collection is finished
    # from its own pytest_collection_finish, which can run before this conftest's, and the controller's scheduler
    # reads the file as soon as every worker has told it.
    _write_lane_groups(items, config)


def _write_lane_groups(items, config) -> None:
    """(worker) Each collected test's group, for the controller's scheduler; written whole, then renamed."""
    target = config.workerinput.get("lane_groups")
    if not target:
        return
    groups = {item.nodeid: group for item in items if (group := lane_group(item))}
    part = Path(f"{target}.{os.getpid()}")
    part.write_text(json.dumps(groups))
    part.replace(target)


def pytest_collection_finish(session):
    """On a fresh machine the node images (debootstrap, network-bound), the torch wheelhouse and the node image with
    torch the collected cluster tests need are made from the session's start, side by side in the background,
    instead of each when a test's cluster first needs it. The fixtures wait for them through the builders' own locks,
    and report a failure themselves (a failed download here only means they try again)."""
    cluster_items = [item for item in session.items if item.get_closest_marker("cluster")]
    if not cluster_items or session.config.option.collectonly:
        return
    wanted = [testcluster.DEFAULT_OS]
    ubuntu = ("ubuntu_cluster", "converged_ubuntu_cluster")
    if any("ubuntu" in item.nodeid or any(f in item.fixturenames for f in ubuntu) for item in cluster_items):
        wanted += UBUNTU_RELEASES
    torch = any("torch_cluster" in item.fixturenames for item in cluster_items)
    wheels = _torch_node_image if torch else build_wheelhouse
    threading.Thread(target=_quietly, args=(wheels,), name="prefetch-wheelhouse", daemon=True).start()
    threading.Thread(target=_quietly, args=(_node_images, wanted), name="prefetch-images", daemon=True).start()


def _node_images(os_names: list[str]) -> None:
    testcluster.ensure_docker(start=os.geteuid() == 0)
    testcluster.ensure_images(os_names)


def _torch_node_image() -> None:
    """The wheelhouse, then the node image with torch (torch_cluster's) once the Debian node image is there."""
    wheelhouse = build_wheelhouse()
    testcluster.ensure_docker(start=os.geteuid() == 0)
    torchenv.node_image(wheelhouse)


def _quietly(work, *args) -> None:
    with contextlib.suppress(nodeimages.ClusterError, subprocess.SubprocessError, OSError):
        work(*args)


@pytest.fixture(autouse=True)
def reports_match_the_schema(request):
    """Every JSON report a test leaves under its tmp_path (a run directory's report.json, a -o file) validates
    against the schema the package publishes (clustercheck schema)."""
    tmp_path = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if tmp_path is None or not tmp_path.exists():
        return
    import jsonschema

    from clustercheck import report

    validator = jsonschema.Draft202012Validator(json.loads(report.schema_text()))
    for path in sorted(tmp_path.rglob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (ValueError, OSError):
            continue
        if isinstance(doc, dict) and "schema_version" in doc:
            errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
            assert not errors, f"{path} does not match the report schema: " + "; ".join(errors[:5])
