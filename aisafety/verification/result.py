"""A verifier's answer per sample: certified, falsified (replayed counterexample), unknown."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import torch


class Verdict(StrEnum):
    CERTIFIED = "certified"  # the property holds on the whole box (proved)
    FALSIFIED = "falsified"  # a replayed point of the box violates it
    UNKNOWN = "unknown"  # bounds too loose (or the MILP point did not replay)
    TIMEOUT = "timeout"  # the per-instance time limit passed before a verdict


def stored_margins(margins: torch.Tensor, verdicts: list[Verdict]) -> torch.Tensor:
    """``margins`` (float64) in float32: a cast rounds to nearest, so a proved bound could
    rise by half an ulp (3e-8 relative) above what was proved; it is rounded down instead.
    A falsified sample's value at its point is only cast."""
    wide = margins.double()
    near = wide.float()
    down = torch.nextafter(near, near.new_tensor(-torch.inf))
    below = torch.where(near.double() > wide, down, near)
    falsified = torch.tensor([v is Verdict.FALSIFIED for v in verdicts], dtype=torch.bool)
    return torch.where(falsified, near, below)


VANISHED = "proved margin below float32's smallest subnormal (1.4e-45)"


def stored_verdicts(
    stored: torch.Tensor, verdicts: list[Verdict], notes: list[str]
) -> tuple[list[Verdict], list[str]]:
    """Verdicts and notes that agree with the ``stored`` (float32) margins.

    A proved margin in (0, 1.4e-45) rounds down to 0 in float32; a row reading certified
    with margin 0 contradicts itself (certified means a margin > 0 was proved), and storing
    the smallest subnormal would claim more than was proved. Such a sample is unknown
    (``VANISHED``): a margin that small separates nothing a float32 network computes.
    """
    gone = [
        v is Verdict.CERTIFIED and not m > 0 for v, m in zip(verdicts, stored.tolist(), strict=True)
    ]
    return (
        [Verdict.UNKNOWN if g else v for g, v in zip(gone, verdicts, strict=True)],
        [VANISHED if g else n for g, n in zip(gone, notes, strict=True)],
    )


@dataclass
class VerificationResult:
    """Per sample: verdict, ``margin``, seconds spent.

    ``margin`` depends on the verdict. Certified, unknown or timeout: a proved lower bound
    of min_k (C f + d)_k on the box (-inf where no bound completed), stored as the largest
    float32 at or below it (``stored_margins``; a certified one whose bound rounds down to 0
    is unknown, ``stored_verdicts``). Falsified: that minimum's value at the
    counterexample (<= 0), an upper bound of the true minimum, not a lower one.
    ``counterexamples`` holds the violating input of each falsified sample (NaN
    elsewhere); ``notes`` says per sample why an unknown one is unknown (``timeout`` or
    ``bounds too loose``), and for a certified one what its proof rests on where that is
    not a proved bound (``complete``'s MILP rows no safe LP bound proves).
    """

    verifier: str
    verdicts: list[Verdict]
    margins: torch.Tensor
    seconds: torch.Tensor
    counterexamples: torch.Tensor
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.verdicts)

    @property
    def certified(self) -> torch.Tensor:
        return torch.tensor([v is Verdict.CERTIFIED for v in self.verdicts], dtype=torch.bool)

    @property
    def falsified(self) -> torch.Tensor:
        return torch.tensor([v is Verdict.FALSIFIED for v in self.verdicts], dtype=torch.bool)

    @property
    def timeouts(self) -> torch.Tensor:
        return torch.tensor([v is Verdict.TIMEOUT for v in self.verdicts], dtype=torch.bool)

    @staticmethod
    def timed_out(verifier: str, like: torch.Tensor, seconds: float) -> VerificationResult:
        """Every sample of a batch (inputs ``like``) out of time: nothing proved (margin -inf)."""
        n = len(like)
        return VerificationResult(
            verifier, [Verdict.TIMEOUT] * n, torch.full((n,), float("-inf")),
            torch.full((n,), seconds), torch.full_like(like, float("nan"), dtype=torch.float32),
            ["timeout"] * n,
        )  # fmt: skip

    @staticmethod
    def concat(parts: list[VerificationResult]) -> VerificationResult:
        return VerificationResult(
            parts[0].verifier,
            [v for p in parts for v in p.verdicts],
            torch.cat([p.margins for p in parts]),
            torch.cat([p.seconds for p in parts]),
            torch.cat([p.counterexamples for p in parts]),
            [n for p in parts for n in p.notes],
        )
