"""What a dataset is to the platform: images in [0, 1] NCHW float32 plus int64 labels."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from aisafety.errors import ConfigError


@dataclass(frozen=True)
class LoadedDataset:
    """A labelled image set held in memory (the evaluated subsets are small).

    ``declared``: whether ``classes`` is the format's own class list (CIFAR-10's names, an
    image folder's subfolders, an npz's ``classes``), or was numbered from the labels (an
    npz without ``classes``, arrays handed in), which say nothing of the class count.
    """

    name: str
    x: torch.Tensor
    y: torch.Tensor
    classes: tuple[str, ...]
    declared: bool = True

    def __post_init__(self) -> None:
        if self.x.dim() != 4 or self.x.shape[0] != self.y.shape[0]:
            raise ConfigError(
                f"dataset {self.name!r}: images {tuple(self.x.shape)} and labels "
                f"{tuple(self.y.shape)} do not form an (N, C, H, W) / (N,) pair"
            )

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def balanced_subset(self, limit: int | None, seed: int = 0) -> LoadedDataset:
        """Up to ``limit`` samples, as many per class as possible, chosen with ``seed``.

        Class balance keeps a small evaluation set from over-weighting frequent classes.
        """
        if limit is None or limit >= len(self):
            return self
        rng = np.random.default_rng(seed)
        labels = self.y.numpy()
        per_class = [rng.permutation(np.flatnonzero(labels == c)) for c in np.unique(labels)]
        chosen: list[int] = []
        rank = 0
        while len(chosen) < limit:
            for indices in per_class:
                if rank < len(indices) and len(chosen) < limit:
                    chosen.append(int(indices[rank]))
            rank += 1
        return self.take(sorted(chosen))

    def uniform_subset(self, limit: int | None, seed: int = 0) -> LoadedDataset:
        """``limit`` samples drawn uniformly without replacement with ``seed``, kept in the
        split's order (``uniform_indices`` tells which)."""
        if limit is None or limit >= len(self):
            return self
        return self.take(uniform_indices(len(self), limit, seed))

    def take(self, index: list[int]) -> LoadedDataset:
        chosen = torch.as_tensor(index, dtype=torch.long)
        return LoadedDataset(self.name, self.x[chosen], self.y[chosen], self.classes, self.declared)


def uniform_indices(n: int, limit: int, seed: int = 0) -> list[int]:
    """The sorted indices ``uniform_subset`` keeps: ``limit`` of ``range(n)``, each subset
    of that size equally likely, drawn by numpy's PCG64 generator seeded with ``seed``."""
    return sorted(np.random.default_rng(seed).choice(n, size=limit, replace=False).tolist())


def images_to_tensor(images: np.ndarray, layout: str) -> torch.Tensor:
    """uint8 (or [0, 1] float) images in ``layout`` ('NHW', 'NHWC' or 'NCHW') -> float NCHW."""
    array = np.asarray(images)
    if layout == "NHW":
        array = array[:, None]
    elif layout == "NHWC":
        array = array.transpose(0, 3, 1, 2)
    elif layout != "NCHW":
        raise ValueError(f"unknown layout {layout!r}")
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if tensor.dtype == torch.uint8:
        return tensor.float().div_(255.0)
    tensor = tensor.float()
    if tensor.numel() and (tensor.min() < 0 or tensor.max() > 1):
        low, high = tensor.min().item(), tensor.max().item()
        raise ConfigError(
            f"float images lie in {low:.4g}..{high:.4g}, and images are in [0, 1]: "
            + (
                "normalised images (a data loader's Normalize) go in un-normalised, with the "
                "model's mean and std given to it"
                if low < 0
                else "divide 0..255 values by 255, or pass them as uint8"
            )
        )
    return tensor


class DatasetSource(ABC):
    """A dataset format on disk (or shipped in the package)."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    needs_path: ClassVar[bool] = True
    # what to evaluate when the files are not at hand: a subset shipped in the package
    shipped_subset: ClassVar[str] = ""

    @abstractmethod
    def load(self, path: Path | None, split: str) -> LoadedDataset:
        """Read the whole ``split`` from ``path`` (no download: the files must be there)."""

    def require_path(self, path: Path | None) -> Path:
        if path is None:
            subset = self.shipped_subset
            shipped = f"; without them, evaluate dataset: {subset}" if subset else ""
            raise ConfigError(
                f"dataset {self.name!r} needs 'path': the folder holding its files "
                f"({self.description}; nothing is downloaded){shipped}"
            )
        path = Path(path).expanduser()
        if not path.exists():
            raise ConfigError(f"dataset {self.name!r}: path {str(path)!r} does not exist")
        return path
