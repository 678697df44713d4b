"""``Deadline.share``: a phase's part of the time a deadline leaves, on its clock, never
past it. Checked on a fake clock (no reading moves during a call), directly and where the
verifiers hand a phase its share (an attack before the bounds, ``bab``'s samples)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aisafety.plugins import default_registry
from aisafety.verification.bab import Outcome
from aisafety.verification.deadline import Deadline, current_deadline, time_limit
from aisafety.verification.graph import build_graph
from aisafety.verification.property import robustness_property
from aisafety.verification.registry import make_verifier


def fixed(now: float):
    """A clock that reads ``now`` every time."""
    return lambda: now


def test_a_share_is_its_fraction_of_the_time_left_on_the_same_clock():
    clock = fixed(10.0)
    share = Deadline(30.0, clock).share(0.25)
    assert share.at == 15.0 and share.clock is clock
    assert Deadline(30.0, clock).share(1.0).at == 30.0
    assert Deadline(30.0, clock).share(0.0).at == 10.0


def test_a_share_is_at_most_the_seconds_given():
    clock = fixed(10.0)
    assert Deadline(30.0, clock).share(0.5, at_most=2.0).at == 12.0
    assert Deadline(30.0, clock).share(0.5, at_most=50.0).at == 20.0
    assert Deadline(30.0, clock).share(1.0, at_most=50.0).at == 30.0


def test_a_share_never_ends_after_its_deadline():
    """6.39 + (15.03 - 6.39) rounds to 15.030000000000001, past 15.03; and a deadline
    already passed gives a share already passed, not one that ends later."""
    assert 6.39 + 1.0 * (15.03 - 6.39) > 15.03  # the case
    assert Deadline(15.03, fixed(6.39)).share(1.0).at == 15.03
    late = Deadline(5.0, fixed(10.0)).share(0.5)
    assert late.at == 5.0 and late.passed()


def small_problem(samples: int):
    torch.manual_seed(2)
    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
    x = torch.rand(samples, 1, 4, 4, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        y = net(x).argmax(1)
    return build_graph(net, (1, 4, 4), "fc"), robustness_property(x, y, 0.1, 3), net


def test_an_attack_gets_its_share_of_the_time_left():
    graph, prop, net = small_problem(2)
    verifier = make_verifier(default_registry(), "alpha-crown", {"attack_share": 0.25})
    seen = []

    def attack(graph, prop, model):
        seen.append(current_deadline())
        return torch.zeros(len(prop), dtype=torch.bool), prop.lower

    verifier.attack = attack
    clock = fixed(100.0)
    verifier.attack_within(graph, prop, net, Deadline(140.0, clock))
    assert seen[0].at == 110.0 and seen[0].clock is clock


@pytest.mark.parametrize(
    ("timeout", "expected"), [(100.0, [104.0, 106.0, 112.0]), (5.0, [104.0, 105.0, 105.0])]
)
def test_each_open_bab_sample_gets_its_part_of_the_batchs_time_at_most_its_timeout(
    timeout, expected, monkeypatch
):
    """Sample s of n gets 1 / (n - s) of what the batch has left, at most the verifier's
    timeout: on a clock that does not move, 12 s for 3 samples is 4, 6 and 12 s."""
    graph, prop, _ = small_problem(3)
    verifier = make_verifier(default_registry(), "bab", {"timeout": timeout})
    root = torch.full((3, 2), -1.0, dtype=torch.float64)  # every sample open
    monkeypatch.setattr(verifier, "bounds_and_boxes", lambda g, p: (root, None, [], ""))
    deadlines = []

    def search(graph, prop, boxes, bound, deadline):
        deadlines.append(deadline)
        return Outcome(bound.clone(), None, "")

    monkeypatch.setattr(verifier, "search", search)
    clock = fixed(100.0)
    with time_limit(Deadline(112.0, clock)):
        verifier.noted_bounds(graph, prop)
    assert [d.at for d in deadlines] == expected
    assert all(d.clock is clock for d in deadlines)
