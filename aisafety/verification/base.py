"""The Verifier base class: bounds per batch, a falsification try, verdicts per sample.

Subclasses give ``lower_bounds`` (a proved lower bound of every spec row on the box, and
the input coefficients of the linear bound when there is one). The base class turns them
into verdicts: certified where every row's bound is > 0; otherwise the relaxation's
minimising corner and the box centre are replayed through the predictor and the sample is
falsified if one violates the property, unknown if not. A batch of B samples has B times
the per-instance ``timeout`` (its seconds are shared equally); a batch whose bounds are
not done by then is ``timeout`` on every sample (``deadline.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field

from aisafety.config_base import PluginConfig, build_config
from aisafety.memory import reuse_freed_memory
from aisafety.verification.bounds import LINEAR_KINDS
from aisafety.verification.budget import GIB, box_bytes, default_budget, memory_limit, refuse
from aisafety.verification.deadline import CLOCKS, Deadline, OutOfTime, time_limit
from aisafety.verification.falsify import Model, replay
from aisafety.verification.graph import BoundGraph
from aisafety.verification.property import Property
from aisafety.verification.result import Verdict, VerificationResult


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
    memory_gib: float | None = Field(
        default=None,
        gt=0,
        description="memory budget of the bound passes in GiB (default: half of the memory "
        "available now); rows and samples are chunked under it, or the run is refused",
    )


class Verifier(ABC):
    """Answers, per sample of a ``Property``, certified / falsified / unknown."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    complete: ClassVar[bool] = False  # settles every ReLU instance given enough time
    kinds: ClassVar[set[str]] = LINEAR_KINDS  # the graph ops it can bound
    Config: ClassVar[type[PluginConfig]] = VerifierConfig

    def __init__(self, config: dict[str, Any] | None = None, **overrides: Any):
        self.config = build_config(
            f"verifier {self.name!r}", self.Config, {**(config or {}), **overrides}
        )

    @classmethod
    def describe(cls) -> dict[str, Any]:
        return {"name": cls.name, "complete": cls.complete, "description": cls.description}

    def check(self, graph: BoundGraph) -> None:
        """Raise, before any work, if ``graph`` has an op this verifier cannot bound."""
        graph.require(self.kinds, f"verifier {self.name!r}")

    @abstractmethod
    def lower_bounds(
        self, graph: BoundGraph, prop: Property
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Lower bounds (B, K) of the spec rows, and input coefficients (B, K, *in) or None."""

    def verify(
        self, graph: BoundGraph, prop: Property, model: Model | None = None
    ) -> VerificationResult:
        """Verdicts for every sample; ``model`` (the predictor) replays counterexamples."""
        self.check(graph)
        model = model or (lambda x: graph.forward(x.to(graph.dtype)))
        limit = self.memory_budget()
        size = self.fitting_batch(graph, prop, limit)
        parts = []
        # the bound passes' large temporaries are reused (``memory.py``) and chunked under
        # the budget (``budget.py``)
        with reuse_freed_memory(), memory_limit(limit):
            for start in range(0, len(prop), size):
                parts.append(self._verify_batch(graph, prop[start : start + size], model))
        return VerificationResult.concat(parts)

    def memory_budget(self) -> int:
        """Bytes the bound passes may take: ``memory_gib``, else the default fraction."""
        gib = self.config.memory_gib
        return default_budget() if gib is None else int(gib * GIB)

    def peak_bytes(self, graph: BoundGraph, batch: int, rows: int) -> int:
        """Estimated peak of ``batch`` samples with ``rows`` spec rows at the smallest chunk
        of rows the bound passes allow (IBP here: the boxes)."""
        return box_bytes(graph, batch)

    def fitting_batch(self, graph: BoundGraph, prop: Property, limit: int) -> int:
        """The batch size to run: ``batch_size``, fewer samples where that would not fit
        ``limit``; refuses before any work where one sample does not fit."""
        rows, size = prop.spec.shape[1], max(1, min(self.config.batch_size, len(prop)))
        one = self.peak_bytes(graph, 1, rows)
        if one > limit:
            raise refuse(
                f"verifier {self.name!r} on model {graph.model!r} (one sample)",
                one,
                limit,
                "raise 'memory_gib' in the verifier's config if the machine has the memory, "
                "or use a lighter verifier ('crown-ibp', then 'ibp')",
            )
        return min(size, limit // one)  # the estimate grows linearly with the batch

    def deadline(self, n: int) -> Deadline:
        """The deadline of a batch of ``n`` samples starting now: ``n`` times the timeout."""
        clock = CLOCKS[self.config.clock]
        return Deadline(clock() + n * self.config.timeout, clock)

    def _verify_batch(self, graph: BoundGraph, prop: Property, model: Model) -> VerificationResult:
        deadline = self.deadline(len(prop))
        began = deadline.clock()
        prop = prop.to(graph.dtype)
        try:
            with torch.no_grad(), time_limit(deadline):
                bounds, coeff = self.lower_bounds(graph, prop)
        except OutOfTime:
            spent = (deadline.clock() - began) / len(prop)
            return VerificationResult.timed_out(self.name, prop.lower, spent)
        margins = (bounds + prop.offset).amin(1)
        certified = margins > 0
        counter = torch.full_like(prop.lower, float("nan"), dtype=torch.float32)
        falsified = torch.zeros_like(certified)
        for candidate in self._candidates(prop, bounds, coeff):
            hit = ~certified & ~falsified & replay(model, prop, candidate)
            counter[hit] = candidate[hit].float()
            falsified |= hit
        seconds = torch.full((len(prop),), (deadline.clock() - began) / max(1, len(prop)))
        verdicts = [
            Verdict.CERTIFIED if c else Verdict.FALSIFIED if f else Verdict.UNKNOWN
            for c, f in zip(certified.tolist(), falsified.tolist(), strict=True)
        ]
        notes = ["bounds too loose" if v is Verdict.UNKNOWN else "" for v in verdicts]
        return VerificationResult(self.name, verdicts, margins.float(), seconds, counter, notes)

    @staticmethod
    def _candidates(prop: Property, bounds: torch.Tensor, coeff: torch.Tensor | None):
        """The box centre and, for a linear bound, the corner minimising the weakest row."""
        yield (prop.lower + prop.upper) / 2
        if coeff is not None:
            worst = bounds.argmin(1)
            a = coeff[torch.arange(len(prop)), worst]
            yield torch.where(a > 0, prop.lower, prop.upper)
