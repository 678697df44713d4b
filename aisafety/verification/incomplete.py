"""The incomplete (bound-propagation) verifiers: IBP, CROWN, Fast-Lin, CROWN-IBP, alpha-CROWN.

See ``bounds.py`` for what each computes. All are sound: a certified sample is robust.
None can prove a violation; a falsified verdict comes from a replayed counterexample.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from pydantic import Field

from aisafety.verification import bounds as b
from aisafety.verification import budget, receptive, search_plan
from aisafety.verification.base import AttackFirstConfig, Verifier
from aisafety.verification.graph import BoundGraph
from aisafety.verification.joint_alpha import joint_alpha, most_joint_bytes
from aisafety.verification.ops import Box
from aisafety.verification.property import Property
from aisafety.verification.relaxations import RELU


def op_is_relu_input(graph: BoundGraph, j: int) -> bool:
    """Whether node ``j`` feeds a ReLU (its bounds are then cropped where they can be)."""
    return any(op.kind == "activation" and op.relaxation is RELU and op.inputs[0] == j
               for op in graph.ops)  # fmt: skip


class IBPVerifier(Verifier):
    rigorous_float32 = True  # float32: rigorous (float32_rounding.py)
    name = "ibp"
    description = (
        "interval bound propagation with elision (Gowal et al. 2018); cost ~2 forward passes"
    )
    kinds = b.IBP_KINDS

    def lower_bounds(self, graph: BoundGraph, prop: Property):
        self.require_float64(graph, prop)
        boxes = b.interval_boxes(graph, prop.lower, prop.upper)
        return b.ibp_spec_lower(graph, boxes, prop.spec), None


class CrownVerifier(Verifier):
    rigorous_float32 = True  # float32: rigorous (float32_rounding.py)
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
                passes.append(self._neuron_bytes(graph, op.inputs[0], batch, grad))
        return max(passes)

    def _neuron_bytes(self, graph: BoundGraph, j: int, batch: int, grad: bool) -> int:
        """One neuron (two rows) of node ``j`` per sample: on its receptive-field crop
        (with the crop's boxes) where ``receptive.py`` crops it, else a dense pass."""
        crops = receptive.crops_for(graph, j) if op_is_relu_input(graph, j) else None
        if crops is None:
            return 2 * budget.row_bytes(graph, j, batch, grad)
        end = crops.end
        one = budget.box_bytes(crops.graph, 1) + 2 * budget.row_bytes(crops.graph, end, 1, grad)
        return batch * one

    @budget.budget_read_once()  # one ledger claim for the boxes' and the spec rows' passes
    def lower_bounds(self, graph: BoundGraph, prop: Property):
        self.require_float64(graph, prop)
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


class Root(NamedTuple):
    """alpha-CROWN's result: the bound (B, K), its input coefficients (B, K, *in), the
    intermediate boxes, and '' or why the joint search fell back to layer by layer."""

    bound: torch.Tensor
    coeff: torch.Tensor
    boxes: list[Box]
    note: str


class AlphaCrownConfig(AttackFirstConfig):
    steps: int = Field(
        default=20,
        ge=0,
        description="Adam steps of the layer-by-layer slope search; the spec rows' search "
        "stops early, per sample, once every row of that sample leads its stop margin and the "
        "sound pass certifies it",
    )
    lr: float = Field(default=0.1, gt=0, description="Adam learning rate of the slopes")
    search_work: float | None = Field(
        default=3e7,
        ge=0,
        description="per sample, the most work (2 x unstable neurons x elements of the "
        "pass) of intermediate bounds' slope searches, deepest layer first; the other "
        "layers keep CROWN's bounds (search_plan.py); null: search every layer",
    )
    joint: bool | Literal["auto"] = Field(
        default="auto",
        description="optimise every layer's slopes together for the spec rows' bound (Xu et "
        "al.'s and auto_LiRPA's alpha-CROWN: each step re-bounds every intermediate layer, "
        "joint_alpha.py) instead of layer by layer; auto: joint on networks with sigmoid or "
        "tanh activations, layer by layer on ReLU-only ones; batches are sized so that one "
        "joint step fits the memory budget, and fall back to layer by layer where not even "
        "one sample's step does",
    )
    joint_steps: int = Field(
        default=75,
        ge=0,
        description="the joint search's Adam steps; a sample stops early once each of its spec "
        "rows is above its stop margin and the sound re-bound certifies it (eran sigmoid: 31 of 36 "
        "settled at 75, median 0.9 CPU s per spec; 1211 needs 69)",
    )
    joint_lr: float = Field(
        default=0.03,
        gt=0,
        description="the joint mode's Adam learning rate of sigmoid/tanh slopes (ReLU "
        "slopes take lr); on eran sigmoid spec 1211 (75 steps) 0.1 stayed at CROWN's bound, "
        "0.03 and 0.01 proved it",
    )


class AlphaCrownVerifier(CrownVerifier):
    """Slopes optimised for the bounds it computes: activations' input bounds (one slope
    per bounded neuron, side and earlier unstable ReLU, ``steps`` of Adam, layer by layer,
    each layer on the optimised boxes before it) from the deepest back as far as
    ``search_work`` allows per sample (CROWN's bounds before that: ``search_plan.py``), then
    the spec rows (one slope per row). alpha-CROWN as Xu et al. (2021) optimises the
    intermediate slopes jointly for the final bound (so does auto_LiRPA's
    ``CROWN-Optimized``); ours does so (``joint_alpha.py``) by default on networks with a
    sigmoid or tanh activation (``joint: auto``), and on ReLU-only ones optimises each
    intermediate bound for its own tightness, which is as sound (docs/certification.md,
    "Default"). Either way CROWN's bound is kept where it is higher."""

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

    def prepare(self) -> None:
        """The first ``torch.optim.Adam`` of a process imports ``torch._dynamo`` (1.1-3.5 s
        of CPU, 9.6 s of wall on a loaded machine, measured for #33), in one call no clock
        check can interrupt: done here, before the first sample's limit starts, as loading
        the model is."""
        torch.optim.Adam([torch.zeros(1, requires_grad=True)])

    @property
    def search_work(self) -> float | None:
        return self.config.search_work

    def boxes(self, graph: BoundGraph, prop: Property, crown: list | None = None):
        """The intermediate boxes with slope searches where ``search_work`` allows; CROWN's
        ``crown`` boxes (computed here when not given) elsewhere."""
        if crown is None and self.search_work is not None:
            crown = b.linear_boxes(graph, prop.lower, prop.upper, "adaptive")
        searched = None if crown is None else search_plan.searched_samples(
            graph, crown, self.search_work
        )  # fmt: skip
        return b.linear_boxes(
            graph, prop.lower, prop.upper, "adaptive", self.alpha_steps, searched, crown
        )

    def peak_bytes(self, graph: BoundGraph, batch: int, rows: int) -> int:
        return budget.box_bytes(graph, batch) + self.pass_bytes(graph, batch, grad=True)

    def runs_joint(self, graph: BoundGraph) -> bool:
        """Whether the spec rows' search is joint: ``joint``, or ``auto`` on a network with
        a sigmoid or tanh activation."""
        return self.config.joint is True or (self.config.joint == "auto" and not graph.relu_only)

    def fitting_batch(self, graph: BoundGraph, prop: Property, limit: int, held: int = 0) -> int:
        """The layerwise search's batch (refused where one sample does not fit), and where
        the joint search runs, no more samples than one joint step fits: a batch it does not
        fit would fall back to the layerwise search as a whole (eran sigmoid: 1.35 GiB per
        sample against 3.1 MiB layerwise). Where not even one sample's joint step fits,
        every batch falls back (its note says so)."""
        size = super().fitting_batch(graph, prop, limit, held)
        if not self.runs_joint(graph):
            return size
        one = most_joint_bytes(graph, 1, prop.spec.shape[1])
        return size if one + held > limit else min(size, (limit - held) // one)

    def lower_bounds(self, graph: BoundGraph, prop: Property):
        return self.noted_bounds(graph, prop)[:2]  # ``bounds_and_boxes`` checks the dtypes

    def noted_bounds(self, graph: BoundGraph, prop: Property):
        """The bound, its coefficients and, with a joint search that fell back, why."""
        root = self.bounds_and_boxes(graph, prop)
        note = f"bounds too loose ({root.note})" if root.note else ""
        return root.bound, root.coeff, [note] * len(prop)

    def bounds_and_boxes(self, graph: BoundGraph, prop: Property) -> Root:
        """The bound (B, K), its input coefficients, the optimised intermediate boxes and
        a note ('' or why the joint search fell back). CROWN's bound comes first and is
        ``record``-ed, so a sample out of time in the slope search keeps what CROWN proved
        (never fewer settled than ``crown``). Samples CROWN already certifies (every row's
        bound + offset > 0) leave the batch: the slope search runs on the open ones only
        and the others keep CROWN's bound, coefficients and boxes. Called directly too
        (vnncomp's joint search, ``complete``'s MILP engine, tests), so it checks the
        dtypes: a float32 graph's bounds carry no rounding margin (``require_float64``)."""
        self.require_float64(graph, prop)
        crown_boxes = b.linear_boxes(graph, prop.lower, prop.upper, "adaptive")
        crown, crown_coeff = b.spec_lower(graph, crown_boxes, prop.spec, "adaptive")
        crown = torch.maximum(crown, b.ibp_spec_lower(graph, crown_boxes, prop.spec))
        self.record(crown, crown_coeff)
        open_ = ~(crown + prop.offset > 0).all(1)
        if not bool(open_.any()):
            return Root(crown, crown_coeff, crown_boxes, "")
        if bool(open_.all()):
            bound, coeff, boxes, note = self.search_open(graph, prop, crown_boxes, crown)
        else:
            part = [(lo[open_], hi[open_]) for lo, hi in crown_boxes]
            found = self.search_open(graph, prop[open_], part, crown[open_])
            bound, coeff = crown.clone(), crown_coeff.clone()
            bound[open_], coeff[open_] = found.bound, found.coeff
            boxes = [(lo.clone(), hi.clone()) for lo, hi in crown_boxes]
            for (lo, hi), (f_lo, f_hi) in zip(boxes, found.boxes, strict=True):
                lo[open_], hi[open_] = f_lo, f_hi
            note = found.note
        self.record(bound, coeff)
        return Root(bound, coeff, boxes, note)

    def search_open(
        self, graph: BoundGraph, prop: Property, crown_boxes: list[Box], crown: torch.Tensor
    ) -> Root:
        """The slope search (joint or layer by layer) on ``prop``'s samples from CROWN's
        boxes; the bound is the highest of the search's, CROWN's ``crown`` and IBP's."""
        joint, note = None, ""
        if self.runs_joint(graph):
            lrs = self.alpha_lr, self.config.joint_lr
            steps = self.config.joint_steps
            joint = joint_alpha(graph, crown_boxes, prop.spec, steps, *lrs, prop.offset)
            if joint is None:
                note = "joint alpha-CROWN over the memory budget: layer by layer"
        if joint is not None:
            bound, coeff, boxes = joint
        else:
            boxes = self.boxes(graph, prop, crown_boxes)
            bound, coeff = b.optimise_slopes(
                graph, boxes, prop.spec, self.alpha_steps, self.alpha_lr, prop.offset
            )
        ibp = b.ibp_spec_lower(graph, boxes, prop.spec)
        bound = torch.maximum(torch.maximum(bound, crown), ibp)
        return Root(bound, coeff, boxes, note)


INCOMPLETE = [IBPVerifier, CrownVerifier, FastLinVerifier, CrownIBPVerifier, AlphaCrownVerifier]
