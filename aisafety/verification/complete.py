"""The complete verifier: settles a ReLU network's property, given time.

It picks its engine by the network's size (``engine: auto``): a fully connected ReLU
network of at most ``milp_max_relus`` ReLUs gets the MILP below, every other network branch
and bound (``bab.py``, the same verifier as ``bab``); ``aisafety verify`` prints which. A
network with sigmoid or tanh activations goes to ``bab`` too, which does not split them:
there it is box-PGD and alpha-CROWN with optimised sigmoid/tanh slopes, run until proved
or out of time, so not complete.

MILP, per sample: box-PGD with restarts for a counterexample (first, before any bound),
alpha-CROWN (certifies the easy ones; out of time, the bound CROWN completed stands),
then the unstable ReLUs' input bounds tightened by MILP (``refine.py``,
up to ``refine_share`` of the timeout) and alpha-CROWN again on them, then one MILP per
remaining spec row (``milp.py``), weakest bound first. The sample's time limit covers every
phase: the batch's alpha-CROWN and box-PGD share B limits (their seconds are charged
equally), the rest of a sample's own limit goes to its refinement and MILPs, and a sample
out of time is ``timeout``. A row
is proved when HiGHS finds no point with ``row <= 1e-5`` (or, with ``exact``, when its
optimum or dual bound is > 0); a point it finds is replayed through the predictor. HiGHS's
MIP answer holds within its tolerances at every node of its tree, which it does not
expose: a row it proves is checked by the safe dual bound of its LP relaxation
(``safe_dual.py``), and a certificate no such bound proves says so in its note, as does
one on boxes ``refine.py`` tightened (HiGHS's MIP bounds moved by ``SAFETY``). A
falsified sample's margin is the lowest row at the point returned (float32, inside the
box: the one the replay checked), whether box-PGD or the MILP found it.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Literal

import numpy as np
import torch
from pydantic import Field

from aisafety.verification import bounds as b
from aisafety.verification.bab import BabConfig, BabVerifier
from aisafety.verification.deadline import WALL_BACKSTOP, Deadline, OutOfTime, time_limit
from aisafety.verification.falsify import Model, checked, replay
from aisafety.verification.float64_margin import added_down
from aisafety.verification.graph import BoundGraph, VerificationError
from aisafety.verification.lp_full import LinearPrograms
from aisafety.verification.milp import Encoding, decide_row, encode, minimise_row
from aisafety.verification.property import Property
from aisafety.verification.refine import refine_boxes
from aisafety.verification.result import (
    Verdict,
    VerificationResult,
    stored_margins,
    stored_verdicts,
)

# what a certificate resting on a MIP answer says (``_unproved``; ``vnncomp``'s conjunctions)
MIP_NOTE = "rest on HiGHS's MIP bound (within its tolerances, not a safe bound)"
# and one bounded on boxes ``refine.py`` tightened (every row: the boxes enter each bound)
REFINED_NOTE = f"the MILP-refined boxes {MIP_NOTE}"


class CompleteConfig(BabConfig):
    batch_size: int = Field(default=16, gt=0)
    alpha_steps: int = Field(default=20, ge=0, description="alpha-CROWN steps for the bounds")
    engine: Literal["auto", "milp", "bab"] = Field(
        default="auto",
        description="what settles the rows the bounds leave open: 'milp' (HiGHS), 'bab' "
        "(branch and bound), or 'auto': MILP on fully connected ReLU networks with at most "
        "milp_max_relus ReLUs, branch and bound on every other",
    )
    milp_max_relus: int = Field(
        default=32, ge=0, description="'auto' uses the MILP up to this many ReLUs (no conv)"
    )
    refine_share: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="share of the timeout for tightening intermediate bounds by MILP (0: off)",
    )
    refine_neuron_time: float = Field(
        default=1.0, gt=0, description="seconds per neuron bound when tightening by MILP"
    )
    exact: bool = Field(
        default=False,
        description="minimise each row to optimality (exact margins) instead of deciding its sign",
    )


class CompleteVerifier(BabVerifier):
    name = "complete"
    description = (
        "box-PGD, alpha-CROWN, then per open row an exact MILP (HiGHS) on fully connected "
        "networks of at most milp_max_relus ReLUs, branch and bound ('bab') on the others; "
        "settles every ReLU network's sample given time; sigmoid/tanh networks go to 'bab' "
        "(not complete there)"
    )
    complete = True
    Config = CompleteConfig
    # its alpha-CROWN bound first; a MILP only raises it, a replayed point is above the minimum
    tighter_than = ("alpha-crown", "crown", "ibp")

    @property
    def alpha_steps(self) -> int:
        return self.config.alpha_steps

    @property
    def alpha_lr(self) -> float:
        return 0.1

    def engine(self, graph: BoundGraph) -> str:
        """'milp' or 'bab': the config's choice, or by the network's size (``auto``)."""
        if self.config.engine != "auto":
            return self.config.engine
        if not graph.relu_only:  # sigmoid or tanh: the MILP encodes ReLUs only
            return "bab"
        relus = sum(math.prod(graph.ops[op.inputs[0]].out_shape) for op in graph.ops
                    if op.kind == "activation")  # fmt: skip
        dense = not any(op.kind == "conv" for op in graph.ops)
        return "milp" if dense and relus <= self.config.milp_max_relus else "bab"

    def check(self, graph: BoundGraph) -> None:
        super().check(graph)
        pools = any(op.kind == "maxpool" for op in graph.ops)
        if self.rigorous and pools and self.engine(graph) == "milp":
            raise VerificationError(
                f"the MILP does not encode max-pooling with float32: rigorous (model "
                f"{graph.model!r}); use engine 'bab', or float32: exact"
            )
        if self.engine(graph) == "milp" and not graph.relu_only:
            raise VerificationError(
                f"verifier {self.name!r} with engine 'milp' needs a ReLU network; model "
                f"{graph.model!r} has sigmoid or tanh activations (use engine 'auto' or 'bab')"
            )

    def _verify_batch(self, graph: BoundGraph, prop: Property, model: Model) -> VerificationResult:
        if self.engine(graph) == "bab":
            return super()._verify_batch(graph, prop, model)
        n = len(prop)
        began = self.began()
        batch = self.deadline(n, began)  # box-PGD and alpha-CROWN, shared by the batch
        clock = batch.clock
        prop = prop.to(graph.dtype)
        self.require_float64(graph, prop, "verify()")  # the base's batch check, skipped here
        attacked, attack = torch.zeros(n, dtype=torch.bool), prop.lower
        bound, boxes, self._progress = None, None, None
        try:
            with time_limit(batch):
                attacked, attack = self.attack_within(graph, prop, model, batch)  # first
                with torch.no_grad():  # alpha-CROWN: fewer unstable ReLUs, tighter big-M
                    bound, _, boxes, _ = self.bounds_and_boxes(graph, prop)
        except OutOfTime:  # what completed stands (``record``); no time left for a MILP
            bound = self._progress[0] if self._progress is not None else None
        if bound is None:
            bound = torch.full(prop.offset.shape, float("-inf"), dtype=prop.offset.dtype)
        bound = added_down(bound, prop.offset)
        shared = (clock() - began) / n
        verdicts, margins, seconds, notes = [], [], [], []
        counter = torch.full_like(prop.lower, float("nan"), dtype=torch.float32)
        for s in range(n):
            start = clock()
            deadline = Deadline(start + self.config.timeout - shared, clock)  # what is left
            if boxes is None:
                deadline = Deadline(start, clock)  # the batch ran out before its bounds
            sample_boxes = [(lo[s : s + 1], hi[s : s + 1]) for lo, hi in boxes or []]
            verdict, margin, point, note = self._one(
                graph, prop[s : s + 1], sample_boxes, bound[s], attacked[s], attack[s], model,
                deadline,
            )  # fmt: skip
            if point is not None:
                counter[s] = point
            verdicts.append(verdict)
            notes.append(note)
            margins.append(margin)
            seconds.append(clock() - start + shared)
        margins = stored_margins(torch.tensor(margins, dtype=torch.float64), verdicts)
        verdicts, notes = stored_verdicts(margins, verdicts, notes)
        return VerificationResult(self.name, verdicts, margins, torch.tensor(seconds), counter,
                                  notes)  # fmt: skip

    def _one(self, graph, prop, boxes, bound, attacked, attack_point, model, deadline: Deadline):
        """One sample: (verdict, margin, counterexample or None, why not settled)."""
        if attacked:
            return Verdict.FALSIFIED, *_checked(model, prop, attack_point[None]), ""
        if bound.min() > 0:
            return Verdict.CERTIFIED, float(bound.min()), None, ""
        if deadline.passed():
            return Verdict.TIMEOUT, float(bound.min()), None, "timeout"
        proved, refined = bound.clone(), False
        if self.config.refine_share > 0 and not self.rigorous:  # its MILPs: exact network
            refine_by = deadline.share(1.0, at_most=self.config.refine_share * self.config.timeout)
            boxes, refined = refine_boxes(graph, boxes, refine_by, self.config.refine_neuron_time)
            try:
                with torch.no_grad(), time_limit(deadline):
                    again, _ = b.optimise_slopes(  # with the offset: stops once certified
                        graph, boxes, prop.spec, self.config.alpha_steps, 0.1, prop.offset
                    )
            except OutOfTime:
                return Verdict.TIMEOUT, float(proved.min()), None, "timeout"
            proved = torch.maximum(proved, added_down(again[0], prop.offset[0]))
            if proved.min() > 0:
                return Verdict.CERTIFIED, float(proved.min()), None, _refined_note(refined)
        try:  # ``encode`` asks the deadline per op, first before any work of its own
            with time_limit(deadline):
                enc = encode(graph, boxes)
        except OutOfTime:
            return Verdict.TIMEOUT, float(proved.min()), None, "timeout"
        by_milp = []  # rows proved by HiGHS's MIP answer alone
        for k in torch.argsort(bound).tolist():
            if proved[k] > 0:
                continue
            left = deadline.left()
            if left <= 0:
                return Verdict.TIMEOUT, float(proved.min()), None, "timeout"
            row = prop.spec[0, k].numpy()
            solve = minimise_row if self.config.exact else decide_row
            # HiGHS's own limit counts wall seconds: on the CPU clock only a backstop, the
            # deadline itself stops it (``deadline.passed`` at its MIP interrupt points)
            limit = left * (WALL_BACKSTOP if self.config.clock == "cpu" else 1.0)
            began = time.perf_counter()
            low, value, point = solve(enc, row, float(prop.offset[0, k]), limit, deadline.passed)
            # HiGHS at its own limit (its wall-clock backstop), or the sample's deadline passed
            out_of_time = deadline.passed() or time.perf_counter() - began >= 0.99 * limit
            if deadline.passed():
                return Verdict.TIMEOUT, float(proved.min()), None, "timeout"
            proved[k] = max(float(proved[k]), low)
            by_milp += [k] if proved[k] > 0 else []
            if point is not None and value <= 0:
                candidate = torch.from_numpy(point).reshape(prop.lower.shape)
                if replay(model, prop, candidate)[0]:  # not the MILP's value: the point's
                    return Verdict.FALSIFIED, *_checked(model, prop, candidate), ""
            if proved[k] <= 0:
                if out_of_time:
                    return Verdict.TIMEOUT, float(proved.min()), None, "timeout"
                why = (
                    "MILP point did not replay"
                    if point is not None and value <= 0
                    else ("MILP stopped without a proof")
                )
                return Verdict.UNKNOWN, float(proved.min()), None, why
        unproved = _unproved(enc, prop, by_milp, deadline)
        note = "; ".join(n for n in (_refined_note(refined), unproved) if n)
        return Verdict.CERTIFIED, float(proved.min()), None, note


def _refined_note(refined: bool) -> str:
    """A certificate's note where ``refine.py`` tightened its boxes: HiGHS's MIP bounds,
    moved out by ``refine.SAFETY``, not proved (docs/certification.md)."""
    return REFINED_NOTE if refined else ""


def _unproved(enc: Encoding, prop: Property, rows: list[int], deadline: Deadline) -> str:
    """'' where the safe LP bound (``safe_dual.py``) of the MILP's relaxation proves every
    row in ``rows`` (each certified by HiGHS's MIP answer); else a note naming the rest: a
    MIP's dual bound or "nothing below the cutoff" holds only within HiGHS's tolerances at
    every node of its tree, which it does not expose (docs/certification.md)."""
    if not rows:
        return ""
    relaxed = LinearPrograms(replace(enc, integrality=np.zeros_like(enc.integrality)))
    left = list(rows)
    try:
        with time_limit(deadline):  # a sample out of time keeps its note
            for k in rows:
                row = prop.spec[0, k].numpy()  # float32: rigorous: less its rounding
                if relaxed.minimum(row, float(prop.offset[0, k]) - enc.rounding(row)) > 0:
                    left.remove(k)
    except OutOfTime:
        pass
    if not left:
        return ""
    return f"rows {left} {MIP_NOTE}"


def _checked(model: Model, prop: Property, candidate: torch.Tensor) -> tuple[float, torch.Tensor]:
    """One sample's margin and counterexample at the point ``replay`` checked."""
    points, values = checked(model, prop, candidate)
    return float(values[0]), points[0]
