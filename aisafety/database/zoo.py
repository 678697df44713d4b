"""The model zoo: checkpoints with a manifest of sha256, recipe and measured metrics.

A zoo is a folder holding ``manifest.json`` and one state-dict file per model. The package
ships one (``aisafety.data/zoo``); ``AISAFETY_ZOO_PATH`` (os.pathsep-separated) adds more, e.g.
the output folder of ``aisafety zoo train``. Loading re-checks the sha256 and uses
``torch.load(weights_only=True)`` so a tampered file can neither load nor run code.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field

from aisafety.database.architectures import build
from aisafety.errors import IntegrityError, UnknownNameError
from aisafety.interfaces import StrictModel
from aisafety.prediction.torch_module import TorchPredictor

MANIFEST = "manifest.json"


class TrainingRecipe(StrictModel):
    """Everything needed to train a zoo entry again."""

    architecture: str = "mnist-cnn"
    dataset: str = "mnist"
    defense: str = "standard"
    defense_config: dict[str, Any] = Field(default_factory=dict)
    epochs: int = Field(default=3, gt=0)
    batch_size: int = Field(default=128, gt=0)
    optimizer: Literal["adam", "sgd"] = "adam"
    lr: float = Field(default=1e-3, gt=0)
    momentum: float = Field(default=0.0, ge=0, lt=1, description="SGD only")
    weight_decay: float = Field(default=0.0, ge=0)
    # "one-cycle": Adam-style one-cycle to ``lr``; "step": ``lr`` times ``lr_decay`` every
    # ``lr_decay_every`` epochs counted from epoch ``lr_decay_from`` (0-based), as VeriGauge.
    lr_schedule: Literal["one-cycle", "step"] = "one-cycle"
    lr_decay: float = Field(default=0.1, gt=0, le=1)
    lr_decay_every: int = Field(default=10, gt=0)
    lr_decay_from: int = Field(default=0, ge=0)
    # "last": the weights after the last epoch; "best-test": the epoch whose training
    # defense's selection score (``TrainingDefense.selection_score``) on the *test set* is
    # highest, as the SoK's code keeps its models (selection on the test set).
    keep: Literal["last", "best-test"] = "last"
    seed: int = 0
    mean: tuple[float, ...] = (0.1307,)
    std: tuple[float, ...] = (0.3081,)
    # Fine-tuning: start from this zoo entry's weights, pinned by their sha256.
    init_from: str | None = None
    init_sha256: str | None = None


class ZooEntry(StrictModel):
    name: str
    file: str
    sha256: str
    architecture: str
    dataset: str
    input_shape: tuple[int, int, int]
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    recipe: TrainingRecipe
    metrics: dict[str, float] = Field(default_factory=dict)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def builtin_zoo() -> Traversable:
    return resources.files("aisafety.data") / "zoo"


def zoo_roots() -> list[Traversable | Path]:
    extra = [Path(p) for p in os.environ.get("AISAFETY_ZOO_PATH", "").split(os.pathsep) if p]
    return [*extra, builtin_zoo()]


def read_manifest(root: Traversable | Path) -> dict[str, ZooEntry]:
    manifest = root / MANIFEST
    if not manifest.is_file():
        return {}
    raw: dict[str, Any] = json.loads(manifest.read_text())
    return {name: ZooEntry(**entry) for name, entry in raw.items()}


def write_manifest_entry(root: Path, entry: ZooEntry) -> None:
    """Add or replace ``entry`` in ``root``'s manifest, keeping the others."""
    root.mkdir(parents=True, exist_ok=True)
    entries = {name: e.model_dump(mode="json") for name, e in read_manifest(root).items()}
    entries[entry.name] = entry.model_dump(mode="json")
    (root / MANIFEST).write_text(json.dumps(entries, indent=2, sort_keys=True) + "\n")


def list_models() -> dict[str, tuple[ZooEntry, Traversable | Path]]:
    """Every zoo entry visible now; earlier roots win over the shipped zoo."""
    found: dict[str, tuple[ZooEntry, Traversable | Path]] = {}
    for root in reversed(zoo_roots()):
        for name, entry in read_manifest(root).items():
            found[name] = (entry, root)
    return found


def load_zoo_state(name: str) -> tuple[ZooEntry, dict[str, torch.Tensor]]:
    """The manifest entry and the sha256-checked state dict of zoo model ``name``."""
    models = list_models()
    if name not in models:
        raise UnknownNameError("zoo model", name, models)
    entry, root = models[name]
    data = (root / entry.file).read_bytes()
    digest = sha256_bytes(data)
    if digest != entry.sha256:
        raise IntegrityError(
            f"zoo model {name!r}: {entry.file} has sha256 {digest[:12]}…, the manifest says "
            f"{entry.sha256[:12]}…; the file is corrupt or was replaced — reinstall or retrain it"
        )
    return entry, torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def load_zoo_model(name: str, device: str | torch.device = "cpu") -> TorchPredictor:
    entry, state = load_zoo_state(name)
    module = build(entry.architecture)
    module.load_state_dict(state)
    return TorchPredictor(
        module, entry.input_shape, entry.num_classes,
        name=name, mean=entry.mean, std=entry.std, device=device,
    )  # fmt: skip
