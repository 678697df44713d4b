"""What is verified: an input box and output rows ``C f(x) + d`` that must all be positive.

The l-inf robustness of a label y at radius eps is the box ``[x - eps, x + eps]``
intersected with ``[0, 1]`` and the rows ``f_y - f_j`` for every j != y (a tie counts as
a violation, as in VNN-COMP's ``Y_j >= Y_y``). VNN-LIB properties (``vnnlib.py``) give
other rows and offsets.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Property:
    """Per sample (first dim): a box of inputs, spec rows (B, K, outputs) and offsets (B, K)."""

    lower: torch.Tensor
    upper: torch.Tensor
    spec: torch.Tensor
    offset: torch.Tensor

    def __len__(self) -> int:
        return self.lower.shape[0]

    def __getitem__(self, index) -> Property:
        return Property(self.lower[index], self.upper[index], self.spec[index], self.offset[index])

    def expand(self, n: int) -> Property:
        """``n`` views of a one-sample property, to replay ``n`` candidates against it."""
        return Property(*(t.expand(n, *t.shape[1:])
                          for t in (self.lower, self.upper, self.spec, self.offset)))  # fmt: skip

    def to(self, dtype: torch.dtype) -> Property:
        return Property(*(t.to(dtype) for t in (self.lower, self.upper, self.spec, self.offset)))

    def rows(self, outputs: torch.Tensor) -> torch.Tensor:
        """``C f + d`` for outputs (B, classes): (B, K); the property fails where a row <= 0.

        The outputs come to the property's device: a GPU predictor replays the candidates of
        a verifier that bounds on the CPU."""
        outputs = outputs.to(self.spec.device)
        return (self.spec.to(outputs.dtype) @ outputs.unsqueeze(2)).squeeze(2) + self.offset.to(
            outputs.dtype
        )

    def inside(self, x: torch.Tensor) -> torch.Tensor:
        """True per sample where ``x`` lies in the box (exactly, no tolerance)."""
        x = x.to(self.lower.dtype).flatten(1)
        return ((x >= self.lower.flatten(1)) & (x <= self.upper.flatten(1))).all(1)


def margin_spec(y: torch.Tensor, num_classes: int, dtype=torch.float64) -> torch.Tensor:
    """Rows e_y - e_j for the j != y, in class order: (B, classes - 1, classes)."""
    eye = torch.eye(num_classes, dtype=dtype, device=y.device)
    rows = eye[y].unsqueeze(1) - eye.unsqueeze(0)  # (B, classes, classes), row y is zero
    keep = ~torch.nn.functional.one_hot(y, num_classes).bool()
    return rows[keep].reshape(len(y), num_classes - 1, num_classes)


def robustness_property(
    x: torch.Tensor, y: torch.Tensor, eps: float, num_classes: int, dtype=torch.float64
) -> Property:
    """l-inf robustness of ``y`` on the eps-ball around ``x`` within [0, 1]. Clamped in
    place: the float64 boxes of 1,024 images at 224x224 are 2.3 GB, and each temporary as
    much again."""
    x = x.to(dtype)
    spec = margin_spec(y, num_classes, dtype)
    return Property(
        (x - eps).clamp_(0, 1), (x + eps).clamp_(0, 1), spec, spec.new_zeros(spec.shape[:2])
    )
