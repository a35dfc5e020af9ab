"""With --container, the image on a node: whether Docker has it (`docker image inspect`), and the environment inside
it (the facts collector run in the image with --environment-only) in place of the host's."""

from __future__ import annotations

from dataclasses import replace

from clustercheck import container
from clustercheck.facts import collect
from clustercheck.facts.model import Image, NodeFacts
from clustercheck.inventory import Node
from clustercheck.stages import bundle, nodeprogram
from clustercheck.transport import CommandResult, Transport

ENVIRONMENT = ("python", "packages", "torch")  # the collector's keys that --environment-only reads in an image


def in_image(
    node: Node, transport: Transport, box: container.Container, facts: NodeFacts, collector: list[str], timeout: float
) -> NodeFacts:
    """FACTS (the host's) with the environment in image BOX in place of the host's (read_image), and the image
    (facts.image): the core stage's and the launch's one way to it."""
    image, environment = read_image(node, transport, box, collector, timeout, facts.gpus_present > 0)
    return collect.build(
        node,
        {**facts.raw, **environment},
        python=facts.python,  # the host's, which the node-side helpers (network, data, records) still run with
        python_source=facts.python_source,
        cluster_size=facts.cluster_size,
        clock_offset=facts.clock_offset,
        clock_uncertainty=facts.clock_uncertainty,
        image=image,
    )


def read_image(
    node: Node, transport: Transport, box: container.Container, collector: list[str], timeout: float, gpus: bool
) -> tuple[Image, dict]:
    """With --container BOX: the image on the node (container.image_of) and, when it is there, the environment
    inside it (the facts collector, with the arguments COLLECTOR and --environment-only: python, packages, torch),
    as the collector's keys (ENVIRONMENT); a key is an error where it could not be read. Each command within
    TIMEOUT seconds; GPUS: the node has GPUs (the image then gets them)."""
    inspected = inspect(transport, box, timeout)
    image = container.image_of(box, inspected, node.user)
    if image.problem:
        return image, {"python": {}, "packages": {"error": image.problem}, "torch": {"error": image.problem}}
    program = [bundle.path(transport.workdir), "facts", *collector, "--environment-only"]
    argv = box.python(program, workdir=transport.workdir, gpus=gpus)
    answer = nodeprogram.call(transport, argv, program="facts --environment-only", timeout=timeout)
    if answer.failure is not None:
        refused = answer.result.exit_status == container.DOCKER_REFUSED
        docker_said = "docker: " in answer.result.stderr  # Docker's own error, not the program's
        said = container.run_problem(answer.result) if docker_said else answer.failure.cause
        why = f"the environment in image {box.image} could not be read: {said}"
        image = replace(image, refused=why if refused else None)
        return image, {"python": {}, "packages": {"error": why}, "torch": {"error": why}}
    raw = answer.value
    python = (raw.get("python") or {}).get("executable")
    return replace(image, python=python), {k: raw.get(k) for k in ENVIRONMENT}


def inspect(transport: Transport, box: container.Container, timeout: float) -> CommandResult:
    """`docker image inspect` of BOX's image on the node (container.image_of reads its answer)."""
    return nodeprogram.run(transport, box.inspect(), timeout=timeout)


def collector_args(node: Node, config) -> list[str]:
    """The facts collector's arguments in the core stage: its deadline for torch's import, the packages to import."""
    args = [str(max(10.0, config.command_timeout - 15))]
    for package in node.packages:
        args += ["--package", package]
    return args
