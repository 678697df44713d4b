"""The Verifier base class: bounds per batch, a falsification try, verdicts per sample.

Subclasses give ``lower_bounds`` (a proved lower bound of every spec row on the box, and
the input coefficients of the linear bound when there is one). The base class turns them
into verdicts: certified where every row's bound is > 0; otherwise the relaxation's
minimising corner and the box centre are replayed through the predictor and the sample is
falsified if one violates the property, unknown if not. A batch of B samples has B times
the per-instance ``timeout`` (its seconds are shared equally, ``deadline.py``).

A verifier that can falsify (``attack_first``) runs box-PGD with restarts on the margin,
from the box's centre, corners and random points, before any bound work (within
``attack_share`` of the limit), and bounds only the samples it did not break. Anytime: a
bound pass that completes is ``record``-ed, so a batch out of time returns the strongest
verdict reached (certified where a completed bound is > 0, else ``timeout`` with that
bound as margin); ``timeout`` with margin -inf only
when no bound completed. A falsified sample's margin is the lowest row at its counterexample
(the float32 point inside the box that the replay checked), whichever search found it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field

from aisafety.config_base import PluginConfig, build_config
from aisafety.memory import reuse_freed_memory
from aisafety.memory_budget import size as size_text
from aisafety.verification import float32_rounding, receptive
from aisafety.verification.bounds import LINEAR_KINDS
from aisafety.verification.budget import GIB, box_bytes, current_budget, memory_limit, refuse
from aisafety.verification.deadline import CLOCKS, Deadline, OutOfTime, time_limit
from aisafety.verification.falsify import Model, checked, pgd_on_rows, replay
from aisafety.verification.float64_margin import added_down
from aisafety.verification.graph import BoundGraph, VerificationError
from aisafety.verification.property import Property
from aisafety.verification.result import (
    Verdict,
    VerificationResult,
    stored_margins,
    stored_verdicts,
)

# float32 copies of every sample's input one verify call holds beside its batch: the
# counterexamples, and the results' as the batches are joined (VerificationResult.concat)
HELD_COPIES = 2


def _lost(route: str) -> str:
    """The refusal's tail where ``route`` made the float64 copy and it was lost on the way."""
    return (
        f"{route} bounds the graph's float64 copy on the property in float64, so this is a "
        "defect of that route (or of a graph whose in_dtype does not convert): please report it"
    )


class VerifierConfig(PluginConfig):
    batch_size: int = Field(default=64, gt=0, description="samples bounded together")
    timeout: float = Field(
        default=60.0, gt=0, description="seconds per sample, every phase included (-> timeout)"
    )
    clock: Literal["wall", "cpu"] = Field(
        default="wall",
        description="what timeout counts: wall seconds, or this process's CPU seconds "
        "(load-independent on a shared machine)",
    )
    float32: Literal["exact", "rigorous"] = Field(
        default="exact",
        description="exact: certificates of the network in exact arithmetic (the default); "
        "rigorous: of the float32 network, every op's worst-case float32 rounding bounded "
        "(crown, fast-lin, deeppoly, crown-ibp, ibp, alpha-crown, bab, complete; may cost a "
        "certificate whose margin is within that rounding, docs/certification.md)",
    )
    memory_gib: float | None = Field(
        default=None,
        gt=0,
        description="memory budget of the bound passes in GiB (default: half of the memory "
        "available now); rows and samples are chunked under it, or the run is refused",
    )


class AttackFirstConfig(VerifierConfig):
    attack_steps: int = Field(default=50, ge=0, description="box-PGD steps before any bound")
    attack_restarts: int = Field(
        default=4, ge=0, description="box-PGD runs from random points, besides centre and corners"
    )
    attack_share: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description="share of the time limit box-PGD may take before the bounds; cut short, "
        "it breaks nothing and the bounds get the rest (1: all of it)",
    )


class Verifier(ABC):
    """Answers, per sample of a ``Property``, certified / falsified / unknown."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    complete: ClassVar[bool] = False  # settles every ReLU instance given enough time
    # verifiers whose margin this one never falls below, per sample (what its paper or its
    # construction proves); the registry-wide contract (tests/test_contract.py) checks it
    tighter_than: ClassVar[tuple[str, ...]] = ()
    kinds: ClassVar[set[str]] = LINEAR_KINDS  # the graph ops it can bound
    attack_first: ClassVar[bool] = False  # box-PGD before the bounds (``AttackFirstConfig``)
    # bounds the float32 network with ``float32: rigorous`` (``float32_rounding.py``)
    rigorous_float32: ClassVar[bool] = False
    Config: ClassVar[type[PluginConfig]] = VerifierConfig

    def __init__(self, config: dict[str, Any] | None = None, **overrides: Any):
        self.config = build_config(
            f"verifier {self.name!r}", self.Config, {**(config or {}), **overrides}
        )
        self._progress: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def record(self, bounds: torch.Tensor, coeff: torch.Tensor | None) -> None:
        """A completed, sound bound of the batch being bounded (kept if out of time later)."""
        if self._progress is not None and bounds.shape == self._progress[0].shape:
            bounds = torch.maximum(bounds, self._progress[0])  # both sound: the larger is
        self._progress = (bounds.detach(), None if coeff is None else coeff.detach())

    def attack(self, graph: BoundGraph, prop: Property, model: Model):
        """Box-PGD on every sample: (broken (B,), the lowest points (B, *in))."""
        steps, restarts = self.config.attack_steps, self.config.attack_restarts
        point = pgd_on_rows(
            lambda x: graph.forward(x.to(graph.dtype)),
            prop,
            steps,
            restarts,
            corners=True,
            fine=True,
        )
        return replay(model, prop, point), point

    def attack_within(self, graph: BoundGraph, prop: Property, model: Model, deadline: Deadline):
        """``attack`` within ``attack_share`` of the time ``deadline`` leaves. Cut short it
        breaks nothing and the bounds get the rest, so at a limit too tight for both the
        bound pass still runs: a verifier that attacks first then settles what ``crown``
        settles with the rest of the limit (#33, docs/certification.md "Time limit")."""
        try:
            with time_limit(deadline.share(self.config.attack_share)):
                return self.attack(graph, prop, model)
        except OutOfTime:
            if deadline.passed():
                raise
            return torch.zeros(len(prop), dtype=torch.bool), prop.lower

    @classmethod
    def describe(cls) -> dict[str, Any]:
        return {
            "name": cls.name,
            "complete": cls.complete,
            "description": cls.description,
            "tighter_than": list(cls.tighter_than),
        }

    def check(self, graph: BoundGraph) -> None:
        """Raise, before any work, if ``graph`` has an op this verifier cannot bound."""
        graph.require(self.kinds, f"verifier {self.name!r}")
        if self.rigorous:
            if not self.rigorous_float32:
                raise VerificationError(
                    f"verifier {self.name!r} has no {float32_rounding.SETTING}: rigorous "
                    "setting; use it with crown, fast-lin, deeppoly, crown-ibp, ibp, "
                    "alpha-crown, bab or complete, or leave float32 at exact (the default)"
                )
            float32_rounding.require(graph, self.name)

    @property
    def rigorous(self) -> bool:
        """Whether this verifier certifies the float32 network (``float32: rigorous``)."""
        return getattr(self.config, "float32", "exact") == "rigorous"

    def require_float64(self, graph: BoundGraph, prop: Property, route: str = "") -> None:
        """Refuse a graph or a box of another dtype than float64 where ``lower_bounds`` is
        called directly (``verify`` bounds the graph's float64 copy on the property widened
        to float64). Only float64 boxes and passes carry rounding margins: a float32 graph's
        own bounds were above values the network takes (fuzz seeds 1002, 1003, 1011: 12 of the
        13 verifiers that bounded it, by 1.7e-8 to 2.7e-6; training bounds its float32 graph
        through ``margins.py``, not a verifier), and a box of another dtype than the graph's
        failed inside torch (``mat1 and mat2 must have the same dtype``). The spec rows and
        offsets too: a float32 spec was torch's ``addmv`` error in 11 verifiers and taken
        silently by the 7 others, a float32 offset taken by all (session 19).

        ``route``: the public call (``verify()``) that made the float64 copy, where the
        check runs inside one; its refusal is then that route's defect, and "call verify()"
        (the fix for a direct call) would be untrue."""
        box = prop.lower.dtype
        if graph.dtype != torch.float64 or box != torch.float64 or prop.upper.dtype != box:
            raise VerificationError(
                f"verifier {self.name!r} bounds float64 graphs and boxes only; model "
                f"{graph.model!r} has a {graph.dtype} graph and the property a {box} box. "
                + (
                    _lost(route)
                    if route
                    else "Call verify(), which bounds the graph's float64 copy on the property "
                    "in float64, or lower_bounds on graph.in_dtype(torch.float64) (or a graph "
                    "built with dtype=torch.float64) and prop.to(torch.float64) (exact)"
                )
            )
        for what, tensor in (("spec", prop.spec), ("offset", prop.offset)):
            if tensor.dtype != torch.float64:
                raise VerificationError(
                    f"verifier {self.name!r} bounds float64 properties only; the property's "
                    f"{what} is {tensor.dtype} on model {graph.model!r}'s {graph.dtype} graph. "
                    + (
                        _lost(route)
                        if route
                        else "Call verify(), which widens the property to float64, or "
                        "lower_bounds on prop.to(torch.float64) (exact)"
                    )
                )

    def prepare(self) -> None:
        """One-time process setup, before any sample's clock starts (none by default)."""
        return None

    def noted_bounds(
        self, graph: BoundGraph, prop: Property
    ) -> tuple[torch.Tensor, torch.Tensor | None, list[str]]:
        """``lower_bounds`` and, per sample, why it may stay open ('' for the default:
        bounds too loose); returned with the bounds, so no note outlives its batch."""
        bounds, coeff = self.lower_bounds(graph, prop)
        return bounds, coeff, [""] * len(prop)

    @abstractmethod
    def lower_bounds(
        self, graph: BoundGraph, prop: Property
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Lower bounds (B, K) of the spec rows, and input coefficients (B, K, *in) or None.
        Each built-in checks ``require_float64`` before any bound for direct calls (alpha-CROWN
        and bab through ``bounds_and_boxes``); the routes that call it (``verify``, the
        VNN-COMP disjuncts' first pass) check it for any verifier."""

    def verify(
        self, graph: BoundGraph, prop: Property, model: Model | None = None
    ) -> VerificationResult:
        """Verdicts for every sample; ``model`` (the predictor) replays counterexamples.

        A graph of another dtype than float64 (``build_graph(..., dtype=torch.float32)``) is
        bounded as its float64 copy, the same weights: only float64 boxes and passes carry
        rounding margins (``ibp_rounding.py``; a float32 graph is training's objective), so
        a float32 graph's bounds could be above the network's values."""
        self.check(graph)
        self.prepare()
        model = model or (lambda x: graph.forward(x.to(graph.dtype)))
        graph = graph.in_dtype(torch.float64)
        budget, held = self.memory_budget(), HELD_COPIES * 4 * prop.lower.numel()
        size = self.fitting_batch(graph, prop, budget, held)
        limit = budget - held  # the bound passes' share
        parts = []
        # the bound passes' large temporaries are reused (``memory.py``) and chunked under
        # the budget (``budget.py``)
        with reuse_freed_memory(), memory_limit(limit), self.arithmetic():
            for start in range(0, len(prop), size):
                parts.append(self._verify_batch(graph, prop[start : start + size], model))
        return VerificationResult.concat(parts)

    def arithmetic(self) -> AbstractContextManager:
        """The bounds' network: the float32 one under ``float32: rigorous`` (its passes
        dense, as ``float32_rounding`` bounds them; no receptive-field crops), else exact."""
        if not self.rigorous:
            return nullcontext()
        stack = ExitStack()
        stack.enter_context(float32_rounding.rigorous())
        stack.enter_context(receptive.dense_passes())
        return stack

    def memory_budget(self) -> int:
        """Bytes the bound passes may take: ``memory_gib``, else the enclosing budget (the
        plan's ``limits.memory_gib``) or the default fraction of the available memory."""
        gib = self.config.memory_gib
        return current_budget() if gib is None else int(gib * GIB)

    def peak_bytes(self, graph: BoundGraph, batch: int, rows: int) -> int:
        """Estimated peak of ``batch`` samples with ``rows`` spec rows at the smallest chunk
        of rows the bound passes allow (IBP here: the boxes)."""
        return box_bytes(graph, batch)

    def fitting_batch(self, graph: BoundGraph, prop: Property, limit: int, held: int = 0) -> int:
        """The batch size to run: ``batch_size``, fewer samples where that would not fit
        ``limit`` beside the ``held`` bytes the whole call keeps for every sample; refuses
        before any work where one sample does not fit."""
        rows, size = prop.spec.shape[1], max(1, min(self.config.batch_size, len(prop)))
        one = self.peak_bytes(graph, 1, rows)
        if one + held > limit:
            beside = f", beside {size_text(held)} for every sample's result" if held else ""
            raise refuse(
                f"verifier {self.name!r} on model {graph.model!r} (one sample{beside})",
                one,
                limit,
                "raise 'memory_gib' in the verifier's config if the machine has the memory, "
                "or use a lighter verifier ('crown-ibp', then 'ibp')"
                + (", or verify fewer samples at once" if held else ""),
            )
        return min(size, (limit - held) // one)  # the estimate grows linearly with the batch

    def deadline(self, n: int, start: float | None = None) -> Deadline:
        """The deadline of a batch of ``n`` samples starting now, or at ``start`` (a reading
        of the verifier's clock): ``n`` times the timeout."""
        clock = CLOCKS[self.config.clock]
        return Deadline((clock() if start is None else start) + n * self.config.timeout, clock)

    def began(self) -> float:
        """A reading of the verifier's clock: a batch's start, its deadline set from it, so
        that its samples' seconds count every second the deadline does (a second reading
        left out a pause between the two: 0.85 s for a timed-out sample of a 1 s limit)."""
        return CLOCKS[self.config.clock]()

    def _verify_batch(self, graph: BoundGraph, prop: Property, model: Model) -> VerificationResult:
        began = self.began()
        deadline = self.deadline(len(prop), began)
        prop = prop.to(graph.dtype)
        self.require_float64(graph, prop, "verify()")  # for every verifier, plugins included
        n = len(prop)
        broken, point = torch.zeros(n, dtype=torch.bool), prop.lower
        margins = torch.full((n,), float("-inf"), dtype=prop.lower.dtype)
        certified, out_of_time = torch.zeros(n, dtype=torch.bool), False
        bounds = coeff = None
        reasons: list[str] = []
        todo = torch.arange(n)
        self._progress = None
        try:
            with time_limit(deadline):
                if self.attack_first:
                    broken, point = self.attack_within(graph, prop, model, deadline)
                    todo = torch.nonzero(~broken).flatten()
                if len(todo):
                    with torch.no_grad():
                        bounds, coeff, reasons = self.noted_bounds(graph, prop[todo])
        except OutOfTime:
            out_of_time = True
            bounds, coeff = self._progress if self._progress is not None else (None, None)
        counter = torch.full_like(prop.lower, float("nan"), dtype=torch.float32)
        falsified = broken.clone()
        if broken.any():  # the points ``replay`` checked: in float32, inside the box
            counter[broken], value = checked(model, prop[broken], point[broken])
            margins[broken] = value.to(margins.dtype)
        if bounds is not None:
            sub = prop[todo]
            margins[todo] = added_down(bounds, sub.offset).amin(1).to(margins.dtype)
            certified[todo] = margins[todo] > 0
            for candidate in self._candidates(sub, bounds, coeff):
                hit = ~certified[todo] & ~falsified[todo] & replay(model, sub, candidate)
                if hit.any():  # the margin at the point, not the bound (as box-PGD's)
                    counter[todo[hit]], value = checked(model, sub[hit], candidate[hit])
                    margins[todo[hit]] = value.to(margins.dtype)
                falsified[todo[hit]] = True
        seconds = torch.full((n,), (deadline.clock() - began) / max(1, n))
        why = ["timeout" if out_of_time else "bounds too loose"] * n
        if not out_of_time and bounds is not None:
            for t, reason in zip(todo.tolist(), reasons, strict=True):
                why[t] = reason or why[t]
        verdicts = [
            Verdict.CERTIFIED if c else Verdict.FALSIFIED if f
            else Verdict.TIMEOUT if w == "timeout" else Verdict.UNKNOWN
            for c, f, w in zip(certified.tolist(), falsified.tolist(), why, strict=True)
        ]  # fmt: skip
        settled = (Verdict.CERTIFIED, Verdict.FALSIFIED)
        notes = ["" if v in settled else w for v, w in zip(verdicts, why, strict=True)]
        margins = stored_margins(margins, verdicts)
        verdicts, notes = stored_verdicts(margins, verdicts, notes)
        return VerificationResult(self.name, verdicts, margins, seconds, counter, notes)

    @staticmethod
    def _candidates(prop: Property, bounds: torch.Tensor, coeff: torch.Tensor | None):
        """The box centre and, for a linear bound, the corner minimising the weakest row."""
        yield (prop.lower + prop.upper) / 2
        if coeff is not None:
            worst = bounds.argmin(1)
            a = coeff[torch.arange(len(prop)), worst]
            yield torch.where(a > 0, prop.lower, prop.upper)
