"""What a node of a given GPU model should be, as data: one YAML file per model in this directory (h100-sxm.yml,
...), each figure with its public source, picked by the GPU name nvidia-smi prints, and extended or overridden by
the user's own file (--expected FILE, or the inventory's clustercheck_expected_file).

The checks read a node's model through `Catalog.match` (facts.model.NodeFacts.expected); where no file describes
the node's GPUs they fall back to what needs no model (the GPU's own maxima, the other nodes) and say so.
Loading is pure: a file that does not fit SCHEMA raises ExpectedError with one line naming the file and the field.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from clustercheck.exitcodes import UsageError

if TYPE_CHECKING:
    import jsonschema

DIRECTORY = Path(__file__).parent
SCHEMA_VERSION = 1

MEMORY_SHORT = 0.95  # nvidia-smi shows a little less than the datasheet; gpu.memory names less than this share of it
# A measured figure against the datasheet's peak: a healthy GPU's large multiply and large copy reach well above
# these shares of it (cuBLAS, a plain copy); a GPU under them is named (checks/gpuperf.py).
MATMUL_SHARE = 0.5
MEMORY_BANDWIDTH_SHARE = 0.6

# The figures a model may give: each one's schema, what it means, and how the checks judge it (docs/checks.md's table
# of figures is rendered from here: figure_table).
FIGURES: dict[str, dict[str, Any]] = {
    "gpus_per_node": {
        "schema": {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 1},
        "means": "the GPU counts a board of the model carries",
        "judged": "`gpu.count` WARNs on another count where the inventory sets no `gpus_per_node` (which always "
        "wins: a cloud VM with part of a board sets it)",
    },
    "memory_gb": {
        "schema": {"type": "number", "exclusiveMinimum": 0},
        "means": "each GPU's memory in GB (10^9 bytes), as the datasheet gives it",
        "judged": f"`gpu.memory` WARNs under {MEMORY_SHORT:.0%} of it (SKIP without the figure)",
    },
    "nvlink_links": {
        "schema": {"type": "integer", "minimum": 0},
        "means": "NVLinks per GPU (0: the model has none)",
        "judged": "`gpu.nvlink` WARNs for a GPU that reports fewer links",
    },
    "nvlink_link_gbps": {
        "schema": {"type": "number", "exclusiveMinimum": 0},
        "means": "each NVLink's bandwidth in GB/s each way",
        "judged": "`gpu.nvlink` WARNs for a link that `nvidia-smi nvlink -s` shows slower",
    },
    "pcie_gen": {
        "schema": {"type": "integer", "minimum": 1},
        "means": "the PCIe generation the GPU supports",
        "judged": "`pcie.link` WARNs where the host gives less (nvidia-smi's `Max`, what GPU and host both support)",
    },
    "pcie_width": {
        "schema": {"type": "integer", "minimum": 1},
        "means": "the PCIe lanes the GPU has",
        "judged": "`pcie.link` WARNs where the slot gives fewer",
    },
    "matmul_bf16_tflops": {
        "schema": {"type": "number", "exclusiveMinimum": 0},
        "means": "the datasheet's dense bf16 tensor-core peak in TFLOP/s (without sparsity)",
        "judged": f"`gpu.perf.matmul` WARNs for a GPU whose bf16 multiply reaches under {MATMUL_SHARE:.0%} of it",
    },
    "matmul_tf32_tflops": {
        "schema": {"type": "number", "exclusiveMinimum": 0},
        "means": "the datasheet's dense TF32 tensor-core peak in TFLOP/s (without sparsity)",
        "judged": f"`gpu.perf.matmul` WARNs for a GPU whose tf32 multiply reaches under {MATMUL_SHARE:.0%} of it",
    },
    "matmul_fp32_tflops": {
        "schema": {"type": "number", "exclusiveMinimum": 0},
        "means": "the datasheet's dense FP32 (no tensor core) peak in TFLOP/s (without sparsity)",
        "judged": f"`gpu.perf.matmul` WARNs for a GPU whose fp32 multiply reaches under {MATMUL_SHARE:.0%} of it",
    },
    "memory_bandwidth_gbps": {
        "schema": {"type": "number", "exclusiveMinimum": 0},
        "means": "the datasheet's GPU memory bandwidth in GB/s",
        "judged": "`gpu.perf.memory` WARNs for a GPU whose copy (bytes read and written counted) reaches under "
        f"{MEMORY_BANDWIDTH_SHARE:.0%} of it",
    },
    "host_copy_gbps": {
        "schema": {"type": "number", "exclusiveMinimum": 0},
        "means": "the least host-to-device and device-to-host bandwidth in GB/s (pinned memory, each byte once) a "
        "GPU of the model reaches: a health check's floor",
        "judged": "`gpu.perf.host_copy` WARNs for a GPU under it either way",
    },
    "intra_node_busbw": {
        "schema": {
            "type": "object",
            "properties": {
                "gpus": {"type": "integer", "minimum": 2},
                "warn_below_gbps": {"type": "number", "exclusiveMinimum": 0},
            },
            "required": ["gpus", "warn_below_gbps"],
            "additionalProperties": False,
        },
        "means": "`{gpus, warn_below_gbps}`: all_reduce busbw (GB/s) among the GPUs of a node of that many",
        "judged": "`allreduce.bandwidth.intra_node` WARNs below it on such a node, unless `--min-busbw` is given",
    },
}


def figure_table() -> str:
    """docs/checks.md's table of figures (scripts/checks_docs.py writes it there, a test compares)."""
    rows = [f"| `{name}` | {f['means']} | {f['judged']} |" for name, f in FIGURES.items()]
    return "\n".join(["| figure | means | judged by |", "| --- | --- | --- |", *rows]) + "\n"


def _figure_schema(value: dict[str, Any]) -> dict[str, Any]:
    """A figure: {value, source, quote, note} (a user's file may give the bare value)."""
    sourced = {
        "type": "object",
        "properties": {
            "value": value,
            "source": {"type": "string", "minLength": 1},
            "quote": {"type": "string", "minLength": 1},
            "note": {"type": "string"},
        },
        "required": ["value"],
        "additionalProperties": False,
    }
    return {"oneOf": [sourced, value]}


SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "models": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "model": {"type": "string", "minLength": 1},
                    "nvidia_smi_names": _figure_schema(
                        {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1}
                    ),
                    "figures": {
                        "type": "object",
                        "properties": {name: _figure_schema(f["schema"]) for name, f in FIGURES.items()},
                        "additionalProperties": False,
                    },
                },
                "required": ["model"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["schema_version", "models"],
    "additionalProperties": False,
}


class ExpectedError(ValueError):
    """A file of expected values that cannot be used; the message names the file and the field, in one line."""


@dataclass(frozen=True)
class Figure:
    value: Any
    source: str | None = None
    quote: str | None = None
    note: str | None = None

    @classmethod
    def of(cls, entry: Any) -> Figure:
        if isinstance(entry, dict) and "value" in entry:
            return cls(entry["value"], entry.get("source"), entry.get("quote"), entry.get("note"))
        return cls(entry)


@dataclass(frozen=True)
class Model:
    """One GPU model's expected values."""

    name: str  # "H100 SXM"
    nvidia_smi_names: tuple[str, ...]  # the Product Name strings nvidia-smi prints for it
    figures: dict[str, Figure] = field(default_factory=dict)
    files: tuple[str, ...] = ()  # where its figures came from (a user's file after the shipped one)

    def get(self, figure: str) -> Any:
        """FIGURE's value, None when this model does not give it."""
        found = self.figures.get(figure)
        return found.value if found else None

    @property
    def label(self) -> str:
        """How a check message names it: the model and the file it came from."""
        return f"{self.name} in {' and '.join(self.files)}"


@dataclass(frozen=True)
class Match:
    """The model a node's GPUs matched (None: no file describes them), and what a check says about it."""

    model: Model | None
    why: str  # the model's label, or why there is none

    def fallback(self, without: str) -> str:
        """The message clause of a check that falls back to what needs no model: WITHOUT says what it did."""
        return f"{self.why}: {without}"


def _key(name: str) -> str:
    return " ".join(name.split()).casefold()


class Catalog:
    """Every model known: the shipped files, then the user's files, which add models or override figures."""

    def __init__(self, models: Iterable[Model] = ()) -> None:
        self.models: dict[str, Model] = {}
        for model in models:
            self.add(model)

    def add(self, model: Model) -> None:
        """MODEL added; a model of the same name keeps the figures MODEL does not give, and its names unless
        MODEL gives its own."""
        old = self.models.get(_key(model.name))
        if old is not None:
            model = Model(
                old.name,
                model.nvidia_smi_names or old.nvidia_smi_names,
                {**old.figures, **model.figures},
                (*old.files, *model.files),
            )
        elif not model.nvidia_smi_names:
            raise ExpectedError(
                f"{', '.join(model.files)}: model {model.name!r} is not a shipped model; give its nvidia_smi_names"
            )
        self.models[_key(model.name)] = model

    def with_file(self, path: str | Path) -> Catalog:
        """This catalog with the models of the user's file PATH added (a copy)."""
        catalog = Catalog(self.models.values())
        for model in load(path):
            catalog.add(model)
        return catalog

    def by_gpu_name(self) -> dict[str, Model]:
        """nvidia-smi name -> model; a later model (a user's) wins a name two models claim."""
        return {_key(name): m for m in self.models.values() for name in m.nvidia_smi_names}

    def match(self, gpu_names: Iterable[str | None]) -> Match:
        """The model of a node whose GPUs nvidia-smi names GPU_NAMES."""
        names = sorted({n for n in gpu_names if n})
        if not names:
            return Match(None, "no GPU name reported, no expected values")
        if len(names) > 1:
            return Match(None, f"GPUs of several models ({', '.join(names)}), no expected values")
        model = self.by_gpu_name().get(_key(names[0]))
        if model is None:
            return Match(None, f"no expected values for {names[0]}")
        return Match(model, f"expected values of {model.label}")


def load(path: str | Path, *, validate: bool = True) -> list[Model]:
    """The models of one file; ExpectedError (one line) when it cannot be read or does not fit SCHEMA (checked
    unless VALIDATE is false: the shipped files, which the test suite checks against it)."""
    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ExpectedError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ExpectedError(f"{path}: not YAML{where} ({getattr(exc, 'problem', None) or exc})") from None
    error = _invalid(document) if validate else None
    if error is not None:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
        raise ExpectedError(f"{path}: {where or 'the file'}: {_short(error)}")
    models = []
    for entry in document["models"]:
        names = Figure.of(entry["nvidia_smi_names"]).value if "nvidia_smi_names" in entry else []
        figures = {name: Figure.of(value) for name, value in (entry.get("figures") or {}).items()}
        models.append(Model(entry["model"], tuple(names), figures, (str(path),)))
    return models


def _invalid(document: Any) -> jsonschema.ValidationError | None:
    import jsonschema  # here, for a user's file only: its import is a good part of a command's start

    return jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(SCHEMA).iter_errors(document))


def _short(error: jsonschema.ValidationError) -> str:
    """A schema error in words that fit one line."""
    if error.validator == "additionalProperties":
        return error.message.replace("Additional properties are not allowed", "unknown field(s)")
    if error.validator == "oneOf":
        return f"{error.instance!r} is not a valid value (a number, a list or {{value, source, quote}})"
    return error.message.splitlines()[0]


def shipped_files() -> list[Path]:
    return sorted(DIRECTORY.glob("*.yml"))


@lru_cache(maxsize=1)
def shipped() -> Catalog:
    """The models shipped in this directory."""
    return Catalog(m for path in shipped_files() for m in _shipped_models(path))


def catalog(path: str | None) -> Catalog:
    """The shipped expected values, with the user's file PATH added (--expected, or the inventory's
    clustercheck_expected_file); a file that cannot be used is a UsageError in one line."""
    try:
        return shipped().with_file(path) if path else shipped()
    except ExpectedError as exc:
        raise UsageError(f"expected values: {exc}") from exc


def _shipped_models(path: Path) -> list[Model]:
    """A shipped file's models, unvalidated at each start (tests/unit/test_expected.py validates every one)."""
    models = load(path, validate=False)
    return [Model(m.name, m.nvidia_smi_names, m.figures, (f"clustercheck/expected/{path.name}",)) for m in models]
