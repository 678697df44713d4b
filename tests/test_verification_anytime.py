"""Anytime answers (#33): ``alpha-crown`` and ``bab`` never settle fewer instances than
``crown``, measured in work, not seconds.

The clock is replaced by a counter that ticks once per reading; every bound op, slope step,
box-PGD step and search round reads it (``check_time``), so a limit of L ticks is a fixed
amount of work whatever the machine's load. ``crown`` bounds; ``alpha-crown`` and ``bab``
first run box-PGD for at most ``attack_share`` (a quarter) of the limit, then the same
CROWN pass, ``record``-ed before any slope search. So given L / 0.75 ticks (and the few
readings the cut itself takes) each settles every sample ``crown`` settles with L, at
every L, whatever the attack would have cost (docs/certification.md, "Time limit").
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from aisafety.plugins import default_registry
from aisafety.verification import deadline as d
from aisafety.verification.graph import build_graph
from aisafety.verification.property import robustness_property
from aisafety.verification.registry import make_verifier
from aisafety.verification.result import Verdict

SETTLED = (Verdict.CERTIFIED, Verdict.FALSIFIED)
LIMITS = [4, 8, 16, 24, 32, 64, 256, 1024]


@pytest.fixture
def ticking_clock(monkeypatch):
    """The 'cpu' clock as a counter: one tick per reading (work, not seconds)."""
    ticks = itertools.count()
    monkeypatch.setitem(d.CLOCKS, "cpu", lambda: float(next(ticks)))
    return ticks


def instances():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 24),
                        nn.ReLU(), nn.Linear(24, 3)).eval()  # fmt: skip
    x = torch.rand(8, 1, 4, 4, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        y = net(x).argmax(1)
    return net, build_graph(net, (1, 4, 4), "mlp"), robustness_property(x, y, 0.1, 3)


def settled(name: str, limit: int, graph, prop, net) -> bool:
    config = {"timeout": limit, "clock": "cpu", "batch_size": 1}
    verdict = make_verifier(default_registry(), name, config).verify(graph, prop, net)
    return verdict.verdicts[0] in SETTLED


def test_alpha_crown_and_bab_settle_what_crown_settles_at_every_work_limit(ticking_clock):
    net, graph, prop = instances()
    crown_count = dict.fromkeys(LIMITS, 0)
    for s in range(len(prop)):
        one = prop[s : s + 1]
        for limit in LIMITS:
            if not settled("crown", limit, graph, one, net):
                continue
            crown_count[limit] += 1
            scaled = math.ceil((limit + 8) / 0.75)  # CROWN gets 3/4, less the cut's readings
            for name in ("alpha-crown", "bab"):
                assert settled(name, scaled, graph, one, net), (name, s, limit)
    # not vacuous: the sweep crosses CROWN's own work (nothing settled at the lowest limit,
    # most samples at the highest)
    assert crown_count[LIMITS[0]] == 0 and crown_count[LIMITS[-1]] >= len(prop) // 2


def test_an_attack_first_verifier_without_a_share_misses_what_crown_settles(ticking_clock):
    """Why the share: given all of the limit (``attack_share`` 1), box-PGD's ~500 ticks
    on this net leave CROWN (~20) no time at a limit where ``crown`` alone settles."""
    net, graph, prop = instances()
    one = prop[0:1]
    assert settled("crown", 64, graph, one, net)
    config = {"timeout": 64, "clock": "cpu", "batch_size": 1, "attack_share": 1.0}
    result = make_verifier(default_registry(), "alpha-crown", config).verify(graph, one, net)
    assert result.verdicts[0] not in SETTLED
