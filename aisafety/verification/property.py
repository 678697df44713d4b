"""What is verified: an input box and output rows ``C f(x) + d`` that must all be positive.

The l-inf robustness of a label y at radius eps is the box ``[x - eps, x + eps]``
intersected with ``[0, 1]`` and the rows ``f_y - f_j`` for every j != y. A certificate
proves every row > 0. A point violates a robustness property where the model's decision
there is wrong: some row < 0, or a row at exactly 0 (a tie) that ``argmax`` resolves
against y (j < y: the first largest wins; ``argmax_ties``). VNN-LIB properties
(``vnnlib.py``) give other rows and offsets, and a row at 0 violates them (VNN-LIB's unsafe
sets are non-strict, ``Y_j >= Y_y``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aisafety.verification.graph import VerificationError


@dataclass
class Property:
    """Per sample (first dim): a box of inputs, spec rows (B, K, outputs) and offsets (B, K).

    ``exact`` is the property a narrowing ``to`` came from: its box is inside this one and
    its offsets are at least these, so a bound proved here holds there, while a
    counterexample must be checked there (``falsify.replay``). ``argmax_ties``: the rows are
    a label's margins ``f_y - f_j`` and a tie is decided as ``argmax`` decides it
    (``violated``)."""

    lower: torch.Tensor
    upper: torch.Tensor
    spec: torch.Tensor
    offset: torch.Tensor
    exact: Property | None = None
    argmax_ties: bool = False

    def __len__(self) -> int:
        return self.lower.shape[0]

    def __getitem__(self, index) -> Property:
        exact = None if self.exact is None else self.exact[index]
        return Property(self.lower[index], self.upper[index], self.spec[index],
                        self.offset[index], exact, self.argmax_ties)  # fmt: skip

    def expand(self, n: int) -> Property:
        """``n`` views of a one-sample property, to replay ``n`` candidates against it."""
        exact = None if self.exact is None else self.exact.expand(n)
        tensors = (self.lower, self.upper, self.spec, self.offset)
        return Property(*(t.expand(n, *t.shape[1:]) for t in tensors), exact, self.argmax_ties)

    @property
    def original(self) -> Property:
        """The property counterexamples are checked against: the one before any narrowing."""
        return self if self.exact is None else self.exact

    def to(self, dtype: torch.dtype) -> Property:
        """This property in ``dtype``, narrowed outward: the box's ends rounded away from
        it, the offsets down, so a bound proved on the result holds on this property (a
        float64 box rounded to nearest in float32 can lose up to half an ulp per side).
        Spec rows must narrow exactly: which way to round a coefficient depends on the
        sign of the output it multiplies."""
        tensors = (self.lower, self.upper, self.spec, self.offset)
        if all(dtype.itemsize >= t.dtype.itemsize for t in tensors):  # widening is exact
            return Property(*(t.to(dtype) for t in tensors), self.exact, self.argmax_ties)
        spec = self.spec.to(dtype)
        if not torch.equal(spec.to(self.spec.dtype), self.spec):
            raise VerificationError(
                f"the property's spec rows are not exact in {dtype} (the graph's dtype): a "
                "bound on the rounded rows would not bound the given ones; verify against a "
                "float64 graph (build_graph(..., dtype=torch.float64))"
            )
        lower, upper = rounded_down(self.lower, dtype), rounded_up(self.upper, dtype)
        offset = rounded_down(self.offset, dtype)
        return Property(lower, upper, spec, offset, self.original, self.argmax_ties)

    def rows(self, outputs: torch.Tensor) -> torch.Tensor:
        """``C f + d`` for outputs (B, classes): (B, K); the property fails where a row <= 0.

        The outputs come to the property's device: a GPU predictor replays the candidates of
        a verifier that bounds on the CPU."""
        outputs = outputs.to(self.spec.device)
        return (self.spec.to(outputs.dtype) @ outputs.unsqueeze(2)).squeeze(2) + self.offset.to(
            outputs.dtype
        )

    def violated(self, outputs: torch.Tensor) -> torch.Tensor:
        """True per sample (B,) where the outputs violate the property: a row < 0, or a row
        at exactly 0 unless ``argmax_ties`` and ``argmax`` keeps the label there (a tie of
        ``f_y`` with ``f_j``, j > y: the model still answers y)."""
        rows = self.rows(outputs)
        tie = rows == 0
        if self.argmax_ties:
            # row e_y - e_j: y where the spec is +1, j where it is -1
            tie &= self.spec.argmin(2) < self.spec.argmax(2)
        return ((rows < 0) | tie).any(1)

    def inside(self, x: torch.Tensor) -> torch.Tensor:
        """True per sample where ``x`` lies in the box (exactly, no tolerance)."""
        x = x.to(self.lower.dtype).flatten(1)
        return ((x >= self.lower.flatten(1)) & (x <= self.upper.flatten(1))).all(1)


def rounded_down(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype``, each value the largest at most the original (NaN stays NaN)."""
    near = t.to(dtype)
    down = torch.nextafter(near, near.new_tensor(-torch.inf))
    return torch.where(near.to(t.dtype) > t, down, near)


def rounded_up(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype``, each value the smallest at least the original (NaN stays NaN)."""
    near = t.to(dtype)
    up = torch.nextafter(near, near.new_tensor(torch.inf))
    return torch.where(near.to(t.dtype) < t, up, near)


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
    lower, upper = (x - eps).clamp_(0, 1), (x + eps).clamp_(0, 1)
    return Property(lower, upper, spec, spec.new_zeros(spec.shape[:2]), argmax_ties=True)
