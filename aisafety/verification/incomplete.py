"""The incomplete (bound-propagation) verifiers: IBP, CROWN, Fast-Lin, CROWN-IBP, alpha-CROWN.

See ``bounds.py`` for what each computes. All are sound: a certified sample is robust.
None can prove a violation; a falsified verdict comes from a replayed counterexample.
"""

from __future__ import annotations

import torch
from pydantic import Field

from aisafety.verification import bounds as b
from aisafety.verification import budget
from aisafety.verification.base import AttackFirstConfig, Verifier
from aisafety.verification.graph import BoundGraph
from aisafety.verification.property import Property


class IBPVerifier(Verifier):
    name = "ibp"
    description = (
        "interval bound propagation with elision (Gowal et al. 2018); cost ~2 forward passes"
    )
    kinds = b.IBP_KINDS

    def lower_bounds(self, graph: BoundGraph, prop: Property):
        boxes = b.interval_boxes(graph, prop.lower, prop.upper)
        return b.ibp_spec_lower(graph, boxes, prop.spec), None


class CrownVerifier(Verifier):
    name = "crown"
    description = (
        "CROWN backward linear relaxation with CROWN intermediate bounds (Zhang et al. 2018)"
    )
    mode = "adaptive"
    kinds = b.CROWN_KINDS
    tighter_than = ("ibp",)  # its boxes are IBP's intersected, its bound the larger of both

    def boxes(self, graph: BoundGraph, prop: Property):
        return b.linear_boxes(graph, prop.lower, prop.upper, self.mode)

    def peak_bytes(self, graph: BoundGraph, batch: int, rows: int) -> int:
        """The boxes and the largest one-neuron (two-row) or one-spec-row backward pass."""
        return budget.box_bytes(graph, batch) + self.pass_bytes(graph, batch)

    def pass_bytes(self, graph: BoundGraph, batch: int, grad: bool = False) -> int:
        end = len(graph.ops) - 1
        passes = [budget.row_bytes(graph, end, batch, grad)]
        deep = b.depends_on_activation(graph)
        for op in graph.ops:
            if op.kind == "activation" and deep[op.inputs[0]]:
                passes.append(2 * budget.row_bytes(graph, op.inputs[0], batch, grad))
        return max(passes)

    def lower_bounds(self, graph: BoundGraph, prop: Property):
        boxes = self.boxes(graph, prop)
        bound, coeff = b.spec_lower(graph, boxes, prop.spec, self.mode)
        return torch.maximum(bound, b.ibp_spec_lower(graph, boxes, prop.spec)), coeff


class FastLinVerifier(CrownVerifier):
    name = "fast-lin"
    description = "Fast-Lin (Weng et al. 2018): CROWN with the parallel ReLU lower line"
    mode = "parallel"


class CrownIBPVerifier(CrownVerifier):
    name = "crown-ibp"
    description = "IBP intermediate bounds, CROWN at the output (Zhang et al. 2020); ~IBP cost"

    def boxes(self, graph: BoundGraph, prop: Property):
        return b.interval_boxes(graph, prop.lower, prop.upper)

    def pass_bytes(self, graph: BoundGraph, batch: int, grad: bool = False) -> int:
        return budget.row_bytes(graph, len(graph.ops) - 1, batch)


class AlphaCrownConfig(AttackFirstConfig):
    steps: int = Field(default=20, ge=0, description="Adam steps on the ReLU lower slopes")
    lr: float = Field(default=0.1, gt=0, description="Adam learning rate of the slopes")


class AlphaCrownVerifier(CrownVerifier):
    """Slopes optimised for every bound it computes: each activation's input bounds (one
    slope per bounded neuron, side and earlier unstable ReLU, ``steps`` of Adam, layer by
    layer, each layer on the optimised boxes before it), then the spec rows (one slope per
    row). alpha-CROWN as Xu et al. (2021) optimises the intermediate slopes jointly for
    the final bound; ours optimises each intermediate bound for its own tightness, which
    is as sound and, with the spec rows optimised last, never looser than CROWN: CROWN's
    bound is kept where it is higher."""

    name = "alpha-crown"
    description = (
        "alpha-CROWN (Xu et al. 2021): box-PGD first, then CROWN with the ReLU lower slopes "
        "optimised for every intermediate and output bound"
    )
    Config = AlphaCrownConfig
    tighter_than = ("crown", "ibp")  # CROWN's bound is kept where it is higher
    attack_first = True

    @property
    def alpha_steps(self) -> int:
        return self.config.steps

    @property
    def alpha_lr(self) -> float:
        return self.config.lr

    def boxes(self, graph: BoundGraph, prop: Property):
        return b.linear_boxes(graph, prop.lower, prop.upper, "adaptive", self.alpha_steps)

    def peak_bytes(self, graph: BoundGraph, batch: int, rows: int) -> int:
        return budget.box_bytes(graph, batch) + self.pass_bytes(graph, batch, grad=True)

    def lower_bounds(self, graph: BoundGraph, prop: Property):
        bound, coeff, _ = self.bounds_and_boxes(graph, prop)
        return bound, coeff

    def bounds_and_boxes(self, graph: BoundGraph, prop: Property):
        """The bound (B, K), its input coefficients and the optimised intermediate boxes.
        CROWN's bound comes first and is ``record``-ed, so a sample out of time in the slope
        search keeps what CROWN proved (never fewer settled than ``crown``)."""
        crown_boxes = b.linear_boxes(graph, prop.lower, prop.upper, "adaptive")
        crown, crown_coeff = b.spec_lower(graph, crown_boxes, prop.spec, "adaptive")
        crown = torch.maximum(crown, b.ibp_spec_lower(graph, crown_boxes, prop.spec))
        self.record(crown, crown_coeff)
        boxes = self.boxes(graph, prop)
        bound, coeff = b.optimise_slopes(graph, boxes, prop.spec, self.alpha_steps, self.alpha_lr)
        ibp = b.ibp_spec_lower(graph, boxes, prop.spec)
        bound = torch.maximum(torch.maximum(bound, crown), ibp)
        self.record(bound, coeff)
        return bound, coeff, boxes


INCOMPLETE = [IBPVerifier, CrownVerifier, FastLinVerifier, CrownIBPVerifier, AlphaCrownVerifier]
