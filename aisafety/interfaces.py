"""Pydantic models for everything that crosses a module boundary.

Specs describe *what to do* (they come from config files and are stored with results);
records describe *what happened* (they go to the results store). Tensors never appear
here: they travel as dataclasses inside a module (see ``attack.result``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    FiniteFloat,
    field_validator,
    model_validator,
)

from aisafety.config_base import number_fix
from aisafety.model_names import NamedEntry, distinct_names, name_forms, own_model_name


class StrictModel(BaseModel):
    """Unknown keys are errors: a typo in a config must not be silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def key(self) -> str:
        """A stable hash of the spec, used to recognise finished work on ``--resume``."""
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


class Capability(StrEnum):
    """What a predictor can give an algorithm."""

    LABELS = "labels"
    SCORES = "scores"
    GRADIENTS = "gradients"
    ACTIVATIONS = "activations"


class Norm(StrEnum):
    L0 = "l0"
    L1 = "l1"
    L2 = "l2"
    LINF = "linf"


class AttackFamily(StrEnum):
    GRADIENT = "gradient"
    SCORE = "score"
    DECISION = "decision"
    TRANSFER = "transfer"


class Direction(StrEnum):
    """Whether a larger value means a more robust model (not: a stronger attack)."""

    HIGHER = "higher"
    LOWER = "lower"
    NEUTRAL = "neutral"


def mean_problem(
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
    scale: float = 1.0,
    plan: bool = True,
) -> str | None:
    """Why ``mean`` cannot be a per-channel mean of the fed pixels in [0, scale], or None.

    A mean above ``scale`` is in 0..255 units over [0, 1] images: it would shift every input
    far off and leave the accuracy at chance, with no other sign of the mistake."""
    if mean is None or max(mean) <= scale:
        return None
    head = (
        f"mean {list(mean)} exceeds {scale:g}: the network is fed pixels in [0, {scale:g}], "
        f"so a per-channel mean is at most {scale:g}"
    )
    if scale != 1:
        return f"{head}; give mean and std in the units after scaling"
    fix = f"mean {[round(m / 255, 4) for m in mean]}"
    if std:
        fix += f" and std {[round(s / 255, 4) for s in std]}"
    keep = "; or keep 0..255 units and add scale: 255 (the network is fed x * 255)"
    return f"{head}. In [0, 1] units (0..255 values / 255) give {fix}" + (keep if plan else "")


ZOO_DEFAULT = "mnist-cnn"  # the model of a plan that names none

# sources whose ``name`` says which model to load: the served model's name (a remote server's
# /v2/models/NAME), the network's name in RobustBench's zoo; a default would load another one
NAMED_SOURCES = ("remote", "robustbench")
NAME_MEANS = {
    "remote": "(name: the served model's name, as in URL/v2/models/NAME; 'aisafety serve' "
    "prints it) ",
    "robustbench": "(name: the network's name in RobustBench's model zoo, e.g. Wong2020Fast) ",
}


class ModelSpec(StrictModel):
    """A model to evaluate.

    ``zoo``: a zoo name, or a model entry a plugin registers (``aisafety_models``).
    ``checkpoint``: a state dict (``path``) and the ``architecture`` that rebuilds it (the
    zoo's or a plugin's, ``aisafety_architectures``). ``python``: the ``nn.Module`` that
    ``factory`` ("package.module:callable", called with ``kwargs``) returns, with an optional
    state dict at ``path``; ``python_path`` folders are searched first (a plan file's folder
    always is). ``export``: a ``torch.export`` archive (``.pt2``). ``torchscript``: a
    TorchScript archive. ``onnx``: an ONNX file, run by onnxruntime (scores only) or, with
    ``gradients: true``, converted to PyTorch and checked against onnxruntime. ``remote``: a
    model served over the Open Inference Protocol v2 at ``url`` (scores only). ``object``:
    the record of a module or predictor handed to ``aisafety.evaluate(model=...)``; it is
    stored with the run, with the ``fingerprint`` of its code and weights, but cannot be
    loaded from a plan file. ``robustbench``: the
    RobustBench model-zoo network ``name`` for ``dataset`` and ``threat_model``, from a
    checkpoint already in ``model_dir`` (RobustBench's layout; never downloaded), with the
    normalisation RobustBench builds into it.

    ``name`` is what the stored run, its warnings and the report call the model. For ``zoo``
    it is the model loaded (default ``mnist-cnn``); ``remote`` and ``robustbench`` need it
    (the served model, RobustBench's entry); a user's file or factory without one is named
    after it (``model_names``), never after the zoo's default; such a derived name stays out
    of ``model_fields_set``, so a plan can tell it from a given one and lengthen it where
    another model of the plan has it (``EvaluationPlan``).

    The input domain, where the network does not take [0, 1] NCHW images: it is fed
    ``(x * scale - mean) / std`` for the platform's images ``x`` in [0, 1] (``scale: 255``
    for raw 0..255 pixels; ``mean``/``std`` in the units after scaling), transposed to
    channels-last for ``layout: nhwc`` (ONNX only). Attacks and budgets stay on [0, 1]
    (docs/prediction.md).
    """

    name: str = ZOO_DEFAULT
    source: Literal[
        "zoo",
        "checkpoint",
        "python",
        "export",
        "torchscript",
        "onnx",
        "remote",
        "object",
        "robustbench",
    ] = "zoo"
    path: Path | None = None
    url: str | None = None
    architecture: str | None = None
    factory: str | None = None
    kwargs: dict[str, Any] | None = None
    python_path: tuple[Path, ...] = ()
    # robustbench models: the zoo's folder, and which leaderboard the name is from
    model_dir: Path | None = None
    dataset: Literal["cifar10", "cifar100", "imagenet"] | None = None
    threat_model: Literal["Linf", "L2", "corruptions", "corruptions_3d"] | None = None
    gradients: bool = False
    input_shape: tuple[int, int, int] | None = None
    num_classes: int | None = Field(default=None, gt=1)
    mean: tuple[FiniteFloat, ...] | None = None
    std: tuple[Annotated[FiniteFloat, Field(gt=0)], ...] | None = None
    scale: float = Field(default=1.0, gt=0, le=1e6, allow_inf_nan=False)
    layout: Literal["nchw", "nhwc"] = "nchw"
    # remote models: seconds per request, and retries of a failed request
    timeout: float | None = Field(default=None, gt=0, le=3600, allow_inf_nan=False)
    retries: int | None = Field(default=None, ge=0, le=20)
    # object models: what aisafety.evaluate(model=...) was given (loading.predictor_fingerprint)
    fingerprint: str | None = None

    @model_validator(mode="after")
    def _own_model_named(self) -> ModelSpec:
        """A model of the user's own file or code without a ``name`` is named after it
        (``model_names.own_model_name``), not after the zoo's default model: the name is
        what the stored plan, the warnings, the report and every comparison call the
        network. Set outside ``model_fields_set``: the name was not given."""
        if "name" not in self.model_fields_set:
            derived = own_model_name(self.source, self.path, self.factory)
            if derived:
                object.__setattr__(self, "name", derived)  # self is the fresh, frozen spec
        return self

    def named(self, name: str) -> ModelSpec:
        """This spec under another derived name (still not given: ``model_fields_set``)."""
        values = {field: getattr(self, field) for field in type(self).model_fields}
        return type(self).model_construct(self.model_fields_set, **{**values, "name": name})

    def shown(self) -> str:
        """What the spec loads, in a few words (for messages about its name)."""
        where = {
            "zoo": f"zoo model {self.name!r}",
            "remote": f"{self.url}",
            "object": "the model= object",
            "robustbench": f"{self.dataset}/{self.threat_model} in {str(self.model_dir)!r}",
        }.get(self.source)
        if where is None:
            file = f" {str(self.path)!r}" if self.path is not None else ""
            where = f"{self.factory!r}{file}" if self.source == "python" else file.strip()
        return f"{self.source} {where}" if self.source != "zoo" else where

    @field_validator("input_shape")
    @classmethod
    def _positive_shape(cls, value: tuple[int, int, int] | None) -> tuple[int, int, int] | None:
        if value is not None and not all(0 < side <= 16384 for side in value):
            raise ValueError(f"input_shape is (C, H, W) with sides in 1..16384, got {value}")
        return value

    @field_validator("factory")
    @classmethod
    def _factory_form(cls, value: str | None) -> str | None:
        module, _, attribute = (value or "").partition(":")
        if value is not None and not (module and attribute and "." not in attribute[:1]):
            raise ValueError(
                f"factory is 'package.module:callable' (e.g. 'mynets:TinyResNet'), got {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _no_ignored_fields(self) -> ModelSpec:
        """A field the source does not read is an error, not a silently ignored setting."""
        used = _MODEL_FIELDS_USED[self.source]
        ignored = [
            f for f in sorted(self.model_fields_set - used - {"source"})
            if getattr(self, f) != type(self).model_fields[f].default
        ]  # fmt: skip
        if ignored:
            module = "layout" in ignored and self.source in MODULE_SOURCES
            raise ValueError(
                f"{', '.join(ignored)} {'is' if len(ignored) == 1 else 'are'} not used by a "
                f"{self.source} model (it reads {', '.join(sorted(used))}); remove "
                f"{'it' if len(ignored) == 1 else 'them'}{MODULE_LAYOUT if module else ''}"
            )
        channels = self.input_shape[0] if self.input_shape else None
        for field in ("mean", "std"):
            value = getattr(self, field)
            if value is not None and channels is not None and len(value) not in (1, channels):
                raise ValueError(
                    f"{field} has {len(value)} values but input_shape {self.input_shape} has "
                    f"{channels} channel(s); give one value per channel"
                )
        return self

    @model_validator(mode="after")
    def _mean_in_the_scaled_units(self) -> ModelSpec:
        problem = mean_problem(self.mean, self.std, self.scale)
        if problem:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _source_needs(self) -> ModelSpec:
        needs = {
            "checkpoint": ("path", "architecture"),
            "python": ("factory", "input_shape"),
            "export": ("path", "input_shape"),
            "torchscript": ("path", "input_shape"),
            "onnx": ("path",),
            "remote": ("url",),
            "robustbench": ("model_dir", "dataset", "threat_model"),
        }.get(self.source, ())
        missing = [field for field in needs if getattr(self, field) is None]
        if self.source in NAMED_SOURCES and "name" not in self.model_fields_set:
            missing.append("name")  # what the server or RobustBench is asked for
        if missing:
            raise ValueError(
                f"a {self.source} model needs {', '.join(repr(m) for m in missing)} "
                f"{NAME_MEANS.get(self.source, '') if 'name' in missing else ''}"
                f"{SHAPE_MEANS if 'input_shape' in missing else ''}(see docs/configuration.md)"
            )
        return self


MODULE_SOURCES = {"python", "checkpoint", "zoo", "export", "torchscript", "robustbench"}
# why a PyTorch module takes no ``layout`` (an ONNX graph's setting), and what to do instead
MODULE_LAYOUT = (
    ": a module is fed (N, C, H, W) batches; wrap one written for channels-last batches so "
    "that its forward runs net(x.permute(0, 2, 3, 1))"
)
# what ``input_shape`` is, where a model without it is refused
SHAPE_MEANS = (
    "(one image's (C, H, W): [3, 32, 32] for CIFAR-10, [1, 28, 28] for MNIST, "
    "[3, 224, 224] for ImageNet) "
)

_MODEL_FIELDS_USED = {
    "zoo": {"name"},
    "checkpoint": {"name", "path", "architecture", "input_shape", "num_classes", "mean", "std",
                   "scale"},
    "python": {"name", "factory", "kwargs", "python_path", "path", "input_shape", "num_classes",
               "mean", "std", "scale"},
    "export": {"name", "path", "input_shape", "num_classes", "mean", "std", "scale"},
    "object": {"name", "input_shape", "num_classes", "fingerprint"},
    "torchscript": {"name", "path", "input_shape", "num_classes", "mean", "std", "scale"},
    "onnx": {"name", "path", "gradients", "input_shape", "num_classes", "mean", "std", "scale",
             "layout"},
    "remote": {"name", "url", "input_shape", "num_classes", "timeout", "retries"},
    "robustbench": {"name", "model_dir", "dataset", "threat_model"},
}  # fmt: skip


@dataclass(frozen=True)
class Architecture:
    """A network a plan can name (``architecture: NAME`` with a ``checkpoint`` state dict),
    returned by the ``aisafety_architectures`` hook.

    ``factory()`` builds the untrained ``torch.nn.Module``; ``input_shape`` (C, H, W) and
    ``num_classes`` are what it takes and gives, and ``mean``/``std`` the per-channel
    normalisation its weights expect when it is not inside the module (a plan's own values
    win). A record that breaks these rules raises here, inside the plugin's hook, so the
    plugin is reported as failed (``aisafety plugins``) and the others still load.
    """

    name: str
    factory: Callable[[], Any]
    input_shape: tuple[int, int, int]
    num_classes: int
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"an architecture needs a non-empty name, got {self.name!r}")
        if not callable(self.factory):
            raise TypeError(f"architecture {self.name!r}: factory {self.factory!r} is not callable")
        shape = tuple(self.input_shape)
        if len(shape) != 3 or not all(isinstance(s, int) and s > 0 for s in shape):
            raise ValueError(f"architecture {self.name!r}: input_shape is (C, H, W), got {shape}")
        if not isinstance(self.num_classes, int) or self.num_classes < 2:
            raise ValueError(f"architecture {self.name!r}: num_classes {self.num_classes!r} < 2")
        for field in ("mean", "std"):
            value = getattr(self, field)
            if value is not None and len(value) not in (1, shape[0]):
                raise ValueError(
                    f"architecture {self.name!r}: {field} has {len(value)} values for "
                    f"{shape[0]} channel(s)"
                )
        if self.std is not None and any(v <= 0 for v in self.std):
            raise ValueError(f"architecture {self.name!r}: std must be > 0, got {self.std}")


@dataclass(frozen=True)
class ModelEntry:
    """A named model a plan can load by name alone (``model: {name: NAME}``), returned by
    the ``aisafety_models`` hook: ``spec`` says how to load it (a ``checkpoint`` of one of the
    plugin's architectures, a ``python`` factory, an archive); its ``name`` is the entry's."""

    name: str
    spec: ModelSpec
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a model entry needs a non-empty name, got {self.name!r}")
        if not isinstance(self.spec, ModelSpec):
            raise TypeError(f"model entry {self.name!r}: spec must be a ModelSpec")
        if self.spec.source == "zoo":
            raise ValueError(
                f"model entry {self.name!r}: spec.source 'zoo' would load another entry by "
                "name; give the checkpoint, python or archive source that loads this one"
            )

    def model_spec(self) -> ModelSpec:
        """The spec to load, named as the entry."""
        return self.spec.model_copy(update={"name": self.name})


# Seeds go to torch, numpy and SQLite (a signed 64-bit integer column).
Seed = Annotated[int, Field(ge=0, le=2**63 - 1, strict=True)]

# Arithmetic of the model passes inside an attack's search (aisafety.attack.precision):
# fp32, the fastest reduced precision the device has (auto), or bf16 / fp16 explicitly.
Precision = Literal["auto", "fp32", "bf16", "fp16"]


# the unit of the neuron coverage metrics: a share of neurons, not of images (no interval)
NEURON_SHARE = "fraction of neurons"
IN_MEMORY_DATA = "arrays"  # the dataset name of data handed to aisafety.evaluate(data=...)


class DatasetSpec(StrictModel):
    """A dataset and the subset of it to evaluate on."""

    name: str = "mnist-embedded"
    path: Path | None = None
    split: Literal["train", "test"] = "test"
    limit: int | None = Field(default=None, gt=0, strict=True)
    seed: Seed = 0
    # how ``limit`` samples are drawn: as many per class as possible (small evaluation sets
    # weigh every class alike) or uniformly from the whole split (as the SoK benchmark does)
    sampling: Literal["balanced", "uniform"] = "balanced"
    # the images and labels handed to aisafety.evaluate(data=...) (dataset ``arrays``): their
    # fingerprint, so a stored plan says which arrays it ran on (loading.fingerprint)
    fingerprint: str | None = None

    @model_validator(mode="after")
    def _fingerprint_of_arrays_only(self) -> DatasetSpec:
        if self.fingerprint is not None and self.name != IN_MEMORY_DATA:
            raise ValueError(
                f"fingerprint records the arrays handed to aisafety.evaluate(data=...) "
                f"(dataset {IN_MEMORY_DATA!r}); dataset {self.name!r} does not take it: remove it"
            )
        return self


def _one_or_many(value: Any) -> Any:
    values = (value,) if isinstance(value, int | float | str) else value
    if isinstance(values, list | tuple):
        for eps in values:  # true/false and "0.1" would otherwise be read as numbers
            if isinstance(eps, str):
                raise ValueError(
                    f"a budget is a number such as 0.1, not the string {eps!r} ({number_fix(eps)})"
                )
            if isinstance(eps, bool) or not isinstance(eps, int | float):
                raise ValueError(f"a budget is a number such as 0.1, got {eps!r}")
    return values


def _valid_budgets(value: tuple[float, ...]) -> tuple[float, ...]:
    if not value:
        raise ValueError("give at least one budget")
    for eps in value:
        if not math.isfinite(eps) or eps < 0:
            raise ValueError(f"budget {eps} is negative, infinite or NaN; budgets are >= 0")
    return value


# One budget or a list of them, in the [0, 1] input scale: ``eps: 0.3`` or ``eps: [0.1, 0.3]``.
Budgets = Annotated[
    tuple[float, ...], BeforeValidator(_one_or_many), AfterValidator(_valid_budgets)
]


def _bare_name(name: str) -> str:
    """``'fgsm '`` was looked up as ``fgsm`` in one place and stored as typed in another."""
    if name != name.strip() or not name:
        raise ValueError(
            f"name {name!r} has spaces around it (or is empty); write {name.strip()!r}"
        )
    return name


PluginName = Annotated[str, AfterValidator(_bare_name)]


def _no_nan(config: dict[str, Any]) -> dict[str, Any]:
    """A NaN setting compares false with every bound, and a plan's JSON copy turns it into
    null (``step_size: .nan`` was stored as None, the default): refused by name."""
    for key, value in config.items():
        if isinstance(value, float) and math.isnan(value):
            raise ValueError(f"config {key}: NaN is not a setting; give a number")
    return config


PluginSettings = Annotated[dict[str, Any], AfterValidator(_no_nan)]


class AttackSpec(StrictModel):
    """One attack with its configuration and budgets."""

    name: PluginName
    config: PluginSettings = Field(default_factory=dict)
    eps: Budgets = (0.1,)

    @property
    def label(self) -> str:
        extra = ",".join(f"{k}={v}" for k, v in sorted(self.config.items()))
        return f"{self.name}({extra})" if extra else self.name


class DefenseSpec(StrictModel):
    """An input defense wrapped around the model."""

    name: PluginName
    config: PluginSettings = Field(default_factory=dict)

    @property
    def label(self) -> str:
        """``jpeg(bpda=True,quality=50)``: the defended model's name carries it, so variants
        of one defense stay apart in the results."""
        extra = ",".join(f"{k}={v}" for k, v in sorted(self.config.items()))
        return f"{self.name}({extra})" if extra else self.name


def defended_name(model: str, defenses: tuple[DefenseSpec, ...]) -> str:
    """``mnist-cnn+jpeg(bpda=True)``: the model and its input defenses, innermost first."""
    return "+".join([model, *(d.label for d in defenses)])


class MetricSpec(StrictModel):
    name: PluginName
    config: PluginSettings = Field(default_factory=dict)


SEVERITY_TABLES = ("auto", "cifar10-c", "tiny-imagenet-c", "imagenet-c")


class CorruptionsSpec(StrictModel):
    """The plan's ``corruptions:`` section: the corrupted sets (name x severity) that the
    corruption metrics (mce, rmce) evaluate, and the severity table they are drawn from
    (``auto``: by image size; docs/corruptions.md). Names are checked against the
    corruption registry when the metrics are built."""

    names: tuple[str, ...] | None = Field(default=None, min_length=1)  # None: all 19
    severities: tuple[int, ...] = Field(default=(1, 2, 3, 4, 5), min_length=1)
    table: Literal[SEVERITY_TABLES] = "auto"
    samples: int | None = Field(default=None, gt=0)  # at most this many samples

    @field_validator("severities")
    @classmethod
    def _severities_in_range(cls, values: tuple[int, ...]) -> tuple[int, ...]:
        bad = [s for s in values if s not in (1, 2, 3, 4, 5)]
        if bad:
            raise ValueError(f"severities {bad} are not in 1..5")
        return values


class WorkLimits(StrictModel):
    """Upper bounds on an attack's iterations, queries and restarts (``steps: 1e12`` is an
    error, not a run that never ends); raise them in the plan's ``limits`` section."""

    steps: int = Field(default=100_000, gt=0, strict=True)
    queries: int = Field(default=1_000_000, gt=0, strict=True)
    restarts: int = Field(default=1_000, gt=0, strict=True)
    # how many runs ``seeds:`` may ask for
    seeds: int = Field(default=100, gt=0, strict=True)
    # random draws per image (smoothing's n and n0, a smoothing defense's samples, SPSA's)
    samples: int = Field(default=1_000_000, gt=0, strict=True)
    # expectation-over-transformation copies of each input per gradient
    eot_samples: int = Field(default=1_000, gt=0, strict=True)
    # candidates per image per update of a population attack (NAttack)
    population: int = Field(default=100_000, gt=0, strict=True)
    # target classes of a targeted attack (also never more than the model's classes - 1)
    targets: int = Field(default=1_000, gt=0, strict=True)
    # the memory budget in GiB: every capability chunks its work under it (attacks,
    # smoothing, neuron outputs, bound passes) or refuses before any work, and a setting
    # whose largest tensor (batch x copies x image) is above it is refused up front; None:
    # half of the available memory for the budget, the machine's memory for the settings
    # (aisafety/memory_budget.py, docs/memory.md)
    memory_gib: float | None = Field(default=None, gt=0)
    # a local model's forward pass that has not returned after this long ends its unit
    forward_seconds: float = Field(default=3600.0, gt=0)


class ExecutorSpec(StrictModel):
    """Where a plan's units run (``executor:`` in a plan, ``--executor`` on the command line;
    docs/scale-out.md). It changes no number: the same plan stores the same values on every
    executor."""

    name: Literal["local", "ray"] = "local"
    # Ray: "auto" (a cluster started with `ray start` on this machine), "ray://host:10001"
    # (Ray Client) or "host:6379"; None starts a private Ray instance on this machine.
    address: str | None = Field(default=None, min_length=1, max_length=500)
    cpus: float = Field(default=1.0, gt=0, le=1024)  # per task
    # per task; None: one GPU when the plan's device is cuda (or auto on a cluster with GPUs)
    gpus: float | None = Field(default=None, ge=0, le=64)
    # Ray retries a task whose worker died or that raised, at most this many times; a unit
    # still failing is stored in unit_failures and the rest of the plan goes on.
    max_retries: int = Field(default=2, ge=0, le=20, strict=True)
    # Tasks submitted beyond the cluster's free task slots. 0: none wait in Ray's queue, so a
    # sharded unit's join runs as soon as its shards are done; an autoscaling cluster grows
    # only for tasks that wait, so set this (e.g. to the slots it may add) to let it grow.
    queue_ahead: int = Field(default=0, ge=0, le=100_000, strict=True)

    @model_validator(mode="after")
    def _ray_settings_need_ray(self) -> ExecutorSpec:
        if self.name == "local" and self.address is not None:
            raise ValueError(
                f"address {self.address!r} is for the ray executor; set name: ray (or "
                "--executor ray), or remove the address"
            )
        return self


def named_entry(spec: ModelSpec, field: str) -> NamedEntry:
    """``spec`` as a plan's ``field``, for ``model_names.distinct_names`` (a function, not a
    method: ``NamedEntry`` stays out of the plugin-facing API)."""
    given = "name" in spec.model_fields_set
    forms = [] if given else name_forms(spec.source, spec.path, spec.factory)
    what = spec.model_dump(mode="json", exclude={"name"})
    if spec.path is not None:  # one file however the plan spells its path
        what["path"] = os.path.abspath(spec.path)
    name = forms[0] if forms else spec.name  # derived afresh, however it was lengthened
    return NamedEntry(field, name, forms, json.dumps(what, sort_keys=True), spec.shown())


class EvaluationPlan(StrictModel):
    """Everything one ``aisafety evaluate`` run does."""

    model: ModelSpec = ModelSpec()
    # The undefended baseline that defense-cost metrics (CAV, CRR/CSR, CCV, COS) and mFR
    # compare the evaluated model against; loaded without the plan's ``defenses``.
    reference_model: ModelSpec | None = None
    dataset: DatasetSpec = DatasetSpec()
    # The data whose activations give the neuron bounds of the coverage metrics (DeepGauge
    # profiles neurons on training data). None: the train split of ``dataset``, all of it.
    profile_dataset: DatasetSpec | None = None
    defenses: tuple[DefenseSpec, ...] = ()
    attacks: tuple[AttackSpec, ...] = ()
    metrics: tuple[MetricSpec, ...] = ()
    corruptions: CorruptionsSpec = CorruptionsSpec()
    batch_size: int = Field(default=128, gt=0, le=1_000_000, strict=True)
    seed: Seed = 0
    # Run the whole plan once per seed (``seeds: [0, 1, 2]``), one stored run each; the
    # seed drives every random choice, attacks' included unless an attack sets its own.
    # ``aisafety report --compare`` of those runs shows each metric as mean +- std.
    seeds: tuple[Seed, ...] | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # Default ``precision`` of every attack that does not set its own (docs/attacks.md):
    # reduced precision searches faster where the hardware has it; successes are fp32.
    precision: Precision = "fp32"
    # Raise these to run a bigger attack on purpose; below them a typo cannot run for days.
    limits: WorkLimits = WorkLimits()
    executor: ExecutorSpec = ExecutorSpec()
    # Attack each (attack, budget) in shards of this many samples, each shard its own task
    # on Ray, with its own random stream (docs/scale-out.md). Part of the unit key: a sharded
    # run stores other draws than an unsharded one, and the same ones on every executor.
    shard_size: int | None = Field(default=None, gt=0, le=100_000_000, strict=True)

    @model_validator(mode="after")
    def _shards_of_whole_batches(self) -> EvaluationPlan:
        """Shards must hold whole batches: the model then sees the same batches sharded or
        not, and a deterministic attack's numbers do not change in their last bits (a batch
        of another size sums its floats in another order)."""
        size, batch = self.shard_size, self.batch_size
        if size is not None and size % batch:
            fit = max(batch, size // batch * batch)
            raise ValueError(
                f"shard_size {size} is not a multiple of batch_size {batch}; use e.g. "
                f"shard_size: {fit} (shards of whole batches keep every number unchanged)"
            )
        return self

    @field_validator("executor", mode="before")
    @classmethod
    def _executor_by_name(cls, value: Any) -> Any:
        """``executor: ray`` as shorthand for ``executor: {name: ray}``."""
        return {"name": value} if isinstance(value, str) else value

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None and (not value or len(set(value)) != len(value)):
            raise ValueError(f"seeds must be a non-empty list of distinct integers, got {value}")
        return value

    @model_validator(mode="after")
    def _seed_or_seeds(self) -> EvaluationPlan:
        """``seed`` beside ``seeds`` was ignored without a word."""
        if self.seeds is not None and "seed" in self.model_fields_set:
            raise ValueError(
                f"the plan gives both seed ({self.seed}) and seeds ({list(self.seeds)}); seeds "
                "runs the plan once per seed, so give one of them"
            )
        return self

    @model_validator(mode="after")
    def _nothing_twice(self) -> EvaluationPlan:
        """``metrics: [ca, ca]`` stored every value twice."""
        for kind, specs in (("metric", self.metrics), ("attack", self.attacks)):
            keys = [spec.key() for spec in specs]
            twice = [spec for spec, key in zip(specs, keys, strict=True) if keys.count(key) > 1]
            if twice:
                raise ValueError(
                    f"{kind} {twice[0].name!r} is listed twice with the same settings; "
                    "list it once (give the copies different config to run variants)"
                )
        return self

    @model_validator(mode="after")
    def _model_names_apart(self) -> EvaluationPlan:
        """Two different models of the plan under one name: a derived one takes the shortest
        parent folder that tells them apart (``runs/a/model.pt``: ``a/model``); given ones
        are refused (``model_names.distinct_names``). The report and comparisons show the
        name only."""
        specs = {f: getattr(self, f) for f in ("model", "reference_model") if getattr(self, f)}
        names = distinct_names([named_entry(spec, field) for field, spec in specs.items()])
        for (field, spec), name in zip(specs.items(), names, strict=True):
            if name != spec.name:  # self is the fresh, frozen plan
                object.__setattr__(self, field, spec.named(name))
        return self

    @model_validator(mode="after")
    def _seeds_within_limits(self) -> EvaluationPlan:
        """``seeds:`` runs the plan once per entry: 5,000 entries are 5,000 runs."""
        if self.seeds is not None and len(self.seeds) > self.limits.seeds:
            raise ValueError(
                f"seeds holds {len(self.seeds):,} seeds, above the limit of "
                f"{self.limits.seeds:,} runs; if you mean it, raise it in the plan: "
                f"'limits: {{seeds: {len(self.seeds)}}}'"
            )
        return self

    @field_validator("attacks", "metrics", "defenses", mode="before")
    @classmethod
    def _names_as_specs(cls, value: Any) -> Any:
        """Allow ``metrics: [ca, aaw]`` as shorthand for ``[{name: ca}, {name: aaw}]``."""
        if isinstance(value, list | tuple):
            return [{"name": v} if isinstance(v, str) else v for v in value]
        return value


class SampleVerdict(StrictModel):
    """One sample under a certified metric; the store writes it as a
    ``verification_samples`` row."""

    sample_index: int
    label: int
    verdict: str  # certified / falsified / unknown / timeout; "radius" for a certified radius
    margin: float | None  # the proved lower bound of the margin (the radius for "radius")
    seconds: float | None
    attack: dict[str, Any] = Field(default_factory=dict)  # the upper-bound attack on it


class SmoothingCertificates(StrictModel):
    """Randomized smoothing's certificate of each image at one setting (``setting``: the
    hash of the noise, samples and alpha); the store writes them once per setting as
    ``smoothing_certificates`` rows, however many metrics read them. One entry per image
    in every column; ``prediction`` -1: abstained."""

    setting: str
    norm: str
    sample_index: tuple[int, ...]
    label: tuple[int, ...]
    prediction: tuple[int, ...]
    p_a_lower: tuple[float, ...]
    radius: tuple[float, ...]
    seconds: tuple[float, ...]

    @model_validator(mode="after")
    def _one_per_image(self) -> SmoothingCertificates:
        columns = (self.label, self.prediction, self.p_a_lower, self.radius, self.seconds)
        if any(len(c) != len(self.sample_index) for c in columns):
            raise ValueError("every column of the certificates needs one entry per image")
        return self


class MetricValue(StrictModel):
    """One number a metric produced, with what it was computed on.

    ``details``: free-form extras stored as JSON with the value. Per-sample records the
    store writes to tables of their own are typed fields: ``verdicts`` (certified metrics)
    and ``smoothing_certificates`` (randomized smoothing).
    """

    metric: str
    value: float
    direction: Direction
    unit: str = ""
    attack: str | None = None
    attack_key: str | None = None
    eps: float | None = None
    n_samples: int
    details: dict[str, Any] = Field(default_factory=dict)
    verdicts: tuple[SampleVerdict, ...] = ()
    smoothing_certificates: SmoothingCertificates | None = None


class RunRecord(StrictModel):
    """What the store keeps about one ``evaluate`` run."""

    run_id: int
    plan: EvaluationPlan
    platform_version: str
    values: tuple[MetricValue, ...] = ()
    resumed_units: int = 0
    # units that still failed after their retries (Ray): "description: error"
    failed_units: tuple[str, ...] = ()
