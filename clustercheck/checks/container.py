"""With `clustercheck run --container IMAGE`: Docker usable by the node user, and the image on the node with a
python that runs (the image's environment is then what python.env, torch.* and consistency.* judge). Without
--container, SKIP."""

from __future__ import annotations

from clustercheck.checks.registry import Finding, fail, node_check, passed, skip
from clustercheck.facts.model import NodeFacts

NOT_ASKED = "no --container image"


@node_check(
    "container.docker",
    proves="with --container: Docker is installed and running on the node, and the node user may use it",
    fix="Install Docker Engine and start it (systemctl enable --now docker); add the node user to the docker group "
    "(usermod -aG docker USER) and open a new session.",
)
def docker(facts: NodeFacts) -> Finding:
    image = facts.image
    if image is None:
        return skip(NOT_ASKED)
    if image.docker_problem:
        return fail(image.docker_problem)
    return passed("Docker answers the node user")


@node_check(
    "container.image",
    proves="with --container: the image is on the node and a python runs inside it",
    fix="Pull the image on the node (docker pull IMAGE, by digest to get the same one everywhere) or load it "
    "(docker save on a node that has it, docker load -i FILE here).",
)
def image(facts: NodeFacts) -> Finding:
    found = facts.image
    if found is None:
        return skip(NOT_ASKED)
    if found.docker_problem:
        return skip("Docker cannot be used (container.docker says why)")
    data = {"image": found.image, "id": found.id, "digests": list(found.digests), "python": found.python}
    if found.image_problem:
        return fail(
            found.image_problem,
            f"Pull the image on the node (docker pull {found.image}) or load it (docker save on a node that has it, "
            "docker load -i FILE here).",
            **data,
        )
    if found.refused:
        return fail(
            found.refused,
            "Docker refused to start the image with clustercheck's options and yours: correct yours "
            "(--container-option), or give a value this Docker allows where it refuses one of NVIDIA's.",
            **data,
        )
    if not found.python:
        return fail(
            facts.why_missing("torch"),
            "Use an image with python and torch in it (NVIDIA's PyTorch images, or your own built on one).",
            **data,
        )
    pulled = f", pulled as {found.digests[0]}" if found.digests else ", not pulled from a registry (no digest)"
    return passed(f"image {found.image} is {found.id}{pulled}; python {found.python}", **data)
