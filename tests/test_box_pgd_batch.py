"""A sample's box-PGD (``falsify.pgd_on_rows``) does not depend on the batch it runs in
(#32): its random restarts are the same draws of one sample's shape for every sample,
scaled to its box, so a verdict ``falsified`` or not is the same alone, in a batch of 4
and in another order. Before, one generator drew the whole batch's restarts, and a sample
got the draws its position left over (the second test's sample 2: falsified alone, not
in the batch)."""

from __future__ import annotations

import torch

from aisafety.verification.falsify import pgd_on_rows, random_starts, replay
from aisafety.verification.property import Property

# four boxes around the well at (0.7, 0.3); box-PGD's settings as ``Verifier.attack``'s
LOWER = [[0.0, 0.0], [0.1, 0.0], [0.2, 0.1], [0.0, 0.2]]
UPPER = [[1.0, 1.0], [1.0, 0.9], [1.0, 1.0], [0.9, 1.0]]
ATTACK = {"steps": 10, "corners": True, "fine": True}


def well(z: torch.Tensor) -> torch.Tensor:
    """Row f0 - f1 = 0.1 - relu(0.3 - |x - (0.7, 0.3)|_1): <= 0 only within 0.2 of the
    centre, flat beyond 0.3, so only a start inside the well finds it. Abs, relu and sums
    of two terms round alike in any batch (no reduction order to change)."""
    x = z.flatten(1)
    dist = (x[:, 0] - 0.7).abs() + (x[:, 1] - 0.3).abs()
    return torch.stack([0.1 - torch.relu(0.3 - dist), torch.zeros_like(dist)], 1)


def boxes(lower: list, upper: list) -> Property:
    lo = torch.tensor(lower, dtype=torch.float64).reshape(-1, 1, 1, 2)
    hi = torch.tensor(upper, dtype=torch.float64).reshape(-1, 1, 1, 2)
    spec = torch.tensor([[1.0, -1.0]], dtype=torch.float64).expand(len(lo), 1, 2).clone()
    return Property(lo, hi, spec, torch.zeros(len(lo), 1, dtype=torch.float64))


def test_a_samples_random_starts_are_its_own():
    """Image-shaped boxes: each sample's starts alone, in the batch and in reverse order
    are the same tensors, inside its box; another seed draws others. Alone, a sample gets
    the old draws (one-sample properties, e.g. every VNN-COMP instance, are unchanged)."""
    lower = torch.rand(4, 3, 4, 4, generator=torch.Generator().manual_seed(1)) * 0.5
    upper = lower + 0.25
    batch = torch.stack(random_starts(lower, upper, 3, seed=7))  # (restarts, B, ...)
    reverse = torch.stack(random_starts(lower.flip(0), upper.flip(0), 3, seed=7)).flip(1)
    for s in range(4):
        alone = torch.stack(random_starts(lower[s : s + 1], upper[s : s + 1], 3, seed=7))
        assert torch.equal(alone[:, 0], batch[:, s])
    assert torch.equal(reverse, batch)
    assert ((batch >= lower) & (batch <= upper)).all()
    assert len(batch.flatten().unique()) == batch.numel()  # restarts and samples differ
    assert not torch.equal(torch.stack(random_starts(lower, upper, 3, seed=8)), batch)
    generator = torch.Generator().manual_seed(7)
    width = upper[:1] - lower[:1]
    old = [lower[:1] + width * torch.rand(width.shape, generator=generator) for _ in range(3)]
    assert torch.equal(torch.stack(old), batch[:, :1])


def test_a_samples_falsification_is_the_same_alone_and_in_a_batch():
    prop = boxes(LOWER, UPPER)
    batch = pgd_on_rows(well, prop, restarts=3, seed=2, **ATTACK)
    alone = [pgd_on_rows(well, prop[s : s + 1], restarts=3, seed=2, **ATTACK) for s in range(4)]
    alone = torch.cat(alone)
    assert torch.equal(batch, alone)
    broken = replay(well, prop, batch)
    assert torch.equal(broken, replay(well, prop, alone))
    # the case under test: verdicts the random restarts decide (the centre and corners
    # alone break only sample 1; with these restarts samples 0 and 2 too, not 3)
    from_centre = replay(well, prop, pgd_on_rows(well, prop, restarts=0, **ATTACK))
    assert (broken & ~from_centre).any() and not broken.all()
