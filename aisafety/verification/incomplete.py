"""The incomplete (bound-propagation) verifiers: IBP, CROWN, Fast-Lin, CROWN-IBP, alpha-CROWN.

See ``bounds.py`` for what each computes. All are sound: a certified sample is robust.
None can prove a violation; a falsified verdict comes from a replayed counterexample.
"""

from __future__ import annotations

import torch
from pydantic import Field

from aisafety.verification import bounds as b
from aisafety.verification.base import Verifier, VerifierConfig
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

    def boxes(self, graph: BoundGraph, prop: Property):
        return b.linear_boxes(graph, prop.lower, prop.upper, self.mode)

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


class AlphaCrownConfig(VerifierConfig):
    steps: int = Field(default=20, ge=0, description="Adam steps on the ReLU lower slopes")
    lr: float = Field(default=0.1, gt=0, description="Adam learning rate of the slopes")


class AlphaCrownVerifier(CrownVerifier):
    name = "alpha-crown"
    description = "alpha-CROWN (Xu et al. 2021): CROWN with optimised ReLU lower slopes"
    Config = AlphaCrownConfig

    def lower_bounds(self, graph: BoundGraph, prop: Property):
        boxes = self.boxes(graph, prop)
        bound, coeff = b.optimise_slopes(graph, boxes, prop.spec, self.config.steps, self.config.lr)
        return torch.maximum(bound, b.ibp_spec_lower(graph, boxes, prop.spec)), coeff


INCOMPLETE = [IBPVerifier, CrownVerifier, FastLinVerifier, CrownIBPVerifier, AlphaCrownVerifier]
