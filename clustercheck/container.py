"""The torch side of a run inside a container image on every node (`clustercheck run --container IMAGE`): the
commands that start it and read the image, and what their answers mean (pure: no I/O).

The image is started the way NVIDIA documents for its PyTorch images (NGC "PyTorch Release Notes", and the NVIDIA
Container Toolkit's user guide: https://docs.nvidia.com/deeplearning/frameworks/pytorch-release-notes/,
https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/docker-specialized.html): the host's
network and IPC namespaces (NCCL's sockets and shared memory as on the host), memlock unlimited and a 64 MiB stack,
`--gpus all` on a GPU node. The run's work directory on the node is mounted at the same path, so the node-side
bundle, the rank records and the logs are where the host-side commands look for them. The container runs as the
node user (so that its files in the work directory are that user's, and a cleanup run as that user can stop what
runs inside) and carries the run's markers, which the cleanup looks for (transport/__init__.py); its label names the
run (`docker ps --filter label=clustercheck.run`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from clustercheck.facts.model import Image
from clustercheck.transport import RUN_MARKER, UNTIL_MARKER, CommandResult

# NVIDIA's options for its PyTorch images; /dev/shm is the host's through --ipc host
NVIDIA_OPTIONS = ("--network", "host", "--ipc", "host", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864")
LABEL = "clustercheck.run"
# sh -c RUN sh DIRECTORY... -- here|there OPTION... IMAGE COMMAND...: each directory to mount made first (as the
# node user: Docker would make a missing one as root), the current directory mounted and the container's working
# directory with `here`, then docker run as the node user, labelled with the run
RUN = (
    'while [ "$1" != -- ]; do mkdir -p -- "$1" || exit 125; shift; done; shift; '
    'if [ "$1" = here ]; then shift; set -- -v "$PWD:$PWD" -w "$PWD" "$@"; else shift; fi; '
    f'exec docker run --rm --user "$(id -u):$(id -g)" --label "{LABEL}=${RUN_MARKER}" "$@"'
)
# The image's python: python3, else python (NVIDIA's images have both)
PYTHON = 'exec "$(command -v python3 || command -v python || echo python3)" "$@"'
DOCKER_REFUSED = 125  # docker run's exit status when Docker itself could not start the container
INSPECT_FORMAT = "{{json .Id}} {{json .RepoDigests}}"


@dataclass(frozen=True)
class Container:
    """IMAGE (a name, name:tag or name@digest, as `docker run` takes it) and the user's own `docker run` options,
    which come after clustercheck's and so can change them (--shm-size, --device, -v)."""

    image: str
    options: tuple[str, ...] = ()

    def run(
        self,
        command: list[str],
        *,
        workdir: str,
        gpus: bool,
        env: tuple[str, ...] = (),
        mounts: tuple[str, ...] = (),
        here: bool = False,
    ) -> list[str]:
        """COMMAND inside the image on a node whose run directory is WORKDIR: environment variables named in ENV
        (set for this command on the node) passed into the container, with the run's markers; WORKDIR and each of
        MOUNTS (directories, made when missing) mounted at their paths. The container works in WORKDIR, or with
        HERE in the directory the command starts in (mounted too), as a user's job does."""
        workdir = workdir.rstrip("/")
        directories: list[str] = []
        for directory in [workdir, *(m.rstrip("/") or "/" for m in mounts)]:
            if not any(directory == d or directory.startswith(d.rstrip("/") + "/") for d in directories):
                directories.append(directory)  # one inside another mounted directory is there already
        options = ["--init", *NVIDIA_OPTIONS, "-e", f"HOME={workdir}"]
        for directory in directories:
            options += ["-v", f"{directory}:{directory}"]
        options += [] if here else ["-w", workdir]
        options += ["--gpus", "all"] if gpus else []
        for name in (RUN_MARKER, UNTIL_MARKER, *env):
            options += ["-e", name]
        where = "here" if here else "there"
        return ["sh", "-c", RUN, "sh", *directories, "--", where, *options, *self.options, self.image, *command]

    def python(self, args: list[str], *, workdir: str, gpus: bool) -> list[str]:
        """The image's own python (python3, else python) with ARGS, inside the image."""
        return self.run(["sh", "-c", PYTHON, "sh", *args], workdir=workdir, gpus=gpus)

    def inspect(self) -> list[str]:
        """The command that prints the image's ID and repository digests on a node (`image_of`)."""
        return ["docker", "image", "inspect", "--format", INSPECT_FORMAT, self.image]


def image_of(container: Container, answer: CommandResult, user: str | None = None) -> Image:
    """What `docker image inspect` (Container.inspect) answered on a node, run as USER."""
    image = container.image
    text = (answer.stderr + "\n" + answer.stdout).strip()
    last = text.splitlines()[-1] if text else ""
    if answer.timed_out:
        return Image(image, docker_problem="`docker image inspect` did not answer in time (is dockerd hung?)")
    if answer.exit_status == 127:
        return Image(image, docker_problem="docker is not installed (command not found)")
    if "permission denied" in text.lower() and "docker" in text.lower():
        who = f"{user} " if user else "the node user "
        return Image(image, docker_problem=f"{who}may not use Docker: {last}")
    if "cannot connect to the docker daemon" in text.lower():
        return Image(image, docker_problem=f"the Docker daemon is not running: {last}")
    if answer.exit_status == 0:
        first = answer.stdout.strip().splitlines()[0] if answer.stdout.strip() else ""
        found, _, digests = first.partition(" ")
        try:
            ident = json.loads(found)
            repo = json.loads(digests or "null") or []
        except ValueError:
            return Image(image, docker_problem=f"`docker image inspect` printed what it should not: {first[:200]}")
        return Image(image, id=str(ident), digests=tuple(str(d) for d in repo))
    if "no such image" in text.lower():
        return Image(image, image_problem=f"image {image} is not on the node")
    return Image(image, docker_problem=f"`docker image inspect {image}`: {answer.cause()}")


def run_problem(answer: CommandResult) -> str:
    """Why a `docker run` (Container.run) did not give what it should, in one line: Docker's own error (exit 125)
    rather than its closing hint, else the command's cause."""
    lines = [line.strip() for line in answer.stderr.splitlines() if line.strip()]
    said = next((line for line in lines if line.startswith("docker: ")), None)
    if said is None:
        return answer.cause()
    if "rlimit type 8" in said:  # RLIMIT_MEMLOCK: NVIDIA's memlock=-1 refused where dockerd may not raise it
        said += (
            " (this Docker may not raise memlock: give the limit it allows, --container-option=--ulimit=memlock=N:N)"
        )
    elif "could not select device driver" in said and "[[gpu]]" in said:  # --gpus all, and no GPU runtime
        said += (
            " (Docker has no GPU runtime on this node: install NVIDIA's Container Toolkit and configure it for Docker, "
            "nvidia-ctk runtime configure --runtime=docker, then systemctl restart docker)"
        )
    return f"exit {answer.exit_status}: {said}"
