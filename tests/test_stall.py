"""The stall rule that hands a conjunction's time from the one-atom search to the joint
search (``stall.py``, ``vnncomp._refuted_by_one_atom``, #33).

Time is a fake clock throughout: the rule reads only the reports' clock readings, and the
route is checked on a clock that never moves (no deadline passes, no wall-clock check).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from test_conjunction_search import OUTPUTS, relu_instance

from aisafety.database.scaled_mlp import scaled_mlp
from aisafety.plugins import default_registry
from aisafety.verification import stall, vnncomp
from aisafety.verification.conjunction_search import JointOutcome
from aisafety.verification.deadline import CLOCKS, Deadline
from aisafety.verification.graph import BoundGraph, build_graph
from aisafety.verification.registry import make_verifier
from aisafety.verification.result import Verdict

LIMIT = 300.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def stalled_at(curve, step: float = 1.0) -> float | None:
    """The first time (a report every ``step`` s from ``step``) at which a watch with
    ``LIMIT`` s stops a search whose lowest bound is ``curve(t)``; None if never."""
    clock = FakeClock()
    watch = stall.StallWatch(Deadline(LIMIT, clock))
    while clock.now + step <= LIMIT:
        clock.now += step
        try:
            watch.note(curve(clock.now))
        except stall.Stalled:
            assert watch.stalled
            return clock.now
    assert not watch.stalled
    return None


def test_a_bound_rising_like_a_log_keeps_its_time():
    """A tree of splits, each level a fixed rise (ratio 1): never stalled; nor a straight
    line (ratio 2)."""
    assert stalled_at(lambda t: -60 + 5 * math.log(t)) is None
    assert stalled_at(lambda t: -60 + 5 * math.log(t), step=0.05) is None
    assert stalled_at(lambda t: -60 + t / 10) is None


def test_a_bound_that_flattens_stalls_after_the_first_slice():
    """A bound closing in on a limit exponentially stalls once its last half's rise is
    at most half the quarter's before (about 45 s here); a flat bound at the first report
    after the first slice (``FIRST_SLICE`` of the limit), never before."""
    first = stall.FIRST_SLICE * LIMIT
    at = stalled_at(lambda t: -5 - 50 * math.exp(-t / 10))
    assert at is not None and first < at < LIMIT / 4
    assert stalled_at(lambda t: -7.0) == first


# (CPU s, lowest bound) of the best atom's own search, every 12th / 6th round, at 300 s
# (session 17, /tmp traces of ``bench/verification.py``): cifar10_small index7739 (eps
# 0.024) to 154 s, index1442 (eps 0.012) to 38 s; each watch began at about 6 s
INDEX7739 = [(8.4, -76.40), (11.2, -49.64), (15.5, -45.76), (19.6, -43.96), (23.9, -42.81),
             (28.5, -42.02), (33.1, -41.38), (37.5, -40.84), (42.2, -40.40), (47.3, -40.02),
             (52.7, -39.68), (58.3, -39.40), (64.1, -39.13), (69.5, -38.87), (75.2, -38.63),
             (81.0, -38.43), (86.8, -38.24), (92.7, -38.05), (98.9, -37.89), (105.2, -37.72),
             (112.0, -37.57), (117.9, -37.43), (124.3, -37.30), (130.7, -37.17),
             (137.5, -37.05), (144.1, -36.93), (151.0, -36.81), (153.9, -36.76)]  # fmt: skip
INDEX1442 = [(7.7, -11.59), (8.2, -7.89), (10.2, -5.73), (12.3, -5.29), (14.3, -5.02),
             (16.4, -4.84), (18.6, -4.71), (20.7, -4.59), (22.9, -4.49), (25.2, -4.40),
             (27.6, -4.34), (29.9, -4.27), (32.3, -4.21), (34.6, -4.15), (37.0, -4.09),
             (37.9, -4.07)]  # fmt: skip


@pytest.mark.parametrize("curve", [INDEX7739, INDEX1442], ids=["index7739", "index1442"])
def test_the_measured_marabou_atoms_keep_their_time(curve):
    """Both atoms' bounds still rose (0.4-1.8 over the last half) when the rule read
    them. Session 17's first rule (the last quarter's rate against the average since the
    first round, which the first rounds' leap dominates) stopped both at about 40 s, and
    the joint search, from its root, stood far below (index1442: -6.3 at 63 s, the atom
    -4.07 at 38 s)."""
    clock = FakeClock()
    clock.now = 6.0
    watch = stall.StallWatch(Deadline(300.0, clock))
    for clock.now, bound in curve:
        watch.note(bound)
    assert not watch.stalled


def test_a_search_below_its_rival_at_the_same_age_stops_there():
    """The equal-age rule: the joint search's probe reached -5 in 10 s of its own; a search
    at -6 after 10 s stops at that report (before the first slice), one at -4 goes on,
    and the rival is not read again (a later dip below -5 does not stop it)."""
    for bound, stops in ((-6.0, True), (-4.0, False)):
        clock = FakeClock()
        watch = stall.StallWatch(Deadline(LIMIT, clock), rival=(10.0, -5.0))
        clock.now = 9.0
        watch.note(-8.0)  # younger than the rival's 10 s: not compared
        clock.now = 10.0
        if stops:
            with pytest.raises(stall.Stalled):
                watch.note(bound)
        else:
            watch.note(bound)
            clock.now = 11.0
            watch.note(-4.0)
        assert watch.stalled is stops


def test_an_infinite_report_is_not_a_point_of_the_curve():
    """A search with no domain open reports inf: skipped (it would make every later rise
    look small)."""
    clock = FakeClock()
    watch = stall.StallWatch(Deadline(LIMIT, clock))
    watch.note(math.inf)
    assert watch.bounds == [] and not watch.stalled


class StallsAtSecondReport(stall.StallWatch):
    """A watch whose rule always says stalled from its second report."""

    made = 0

    def __init__(self, deadline: Deadline, rival=None):
        super().__init__(deadline, rival)
        StallsAtSecondReport.made += 1

    def note(self, bound: float) -> None:
        self.bounds.append(bound)
        if len(self.bounds) >= 2:
            self.stalled = True
            raise stall.Stalled


# seed, target, eps: atoms 0, 2 and 3 are falsified alone, atom 1 (the highest bound, so
# the route's first) neither proved nor falsified in 5 s; the joint search proves that the
# conjunction never holds (``unsat``) in a few seconds
INSTANCE, BEST_ATOM = (2, 1, 0.25), 1


def test_bab_reports_each_round_and_a_stalled_search_keeps_its_anytime_bound(monkeypatch):
    """``bab``'s search on one atom reports its lowest bound after each round, and ends
    at ``Stalled`` as at its deadline: its margin is the bound it reported last, not a
    verdict. Before: no report (the watch saw nothing, the search ran on)."""
    monkeypatch.setitem(CLOCKS, "cpu", FakeClock())
    net, prop = relu_instance(*INSTANCE)
    graph = build_graph(net, (1, 4, 4), "mlp")
    checker = make_verifier(default_registry(), "bab", {"timeout": LIMIT, "clock": "cpu"})
    atom = vnncomp.prop_row(prop, BEST_ATOM)
    with stall.watching(StallsAtSecondReport(checker.deadline(1))) as watch:
        result = checker.verify(graph, atom.to(graph.dtype))
    assert watch.stalled and len(watch.bounds) == 2
    assert result.verdicts[0] not in (Verdict.CERTIFIED, Verdict.FALSIFIED)
    assert watch.bounds[0] <= watch.bounds[1] <= 0
    # the margin is that bound, rounded down where stored (float32 there)
    assert watch.bounds[1] - 1e-6 <= float(result.margins[0]) <= watch.bounds[1]


@dataclass
class Mlp:
    """Stands for ``vnncomp.Network``: the bound graph and the replay."""

    graph: BoundGraph
    module: torch.nn.Module

    def run(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.module(x.float())


def conjunction_route() -> vnncomp.InstanceResult:
    """``_verify_conjunctions`` with ``bab`` on ``INSTANCE``'s one disjunct of all its
    atoms, ``LIMIT`` s; counts the watches made afresh."""
    StallsAtSecondReport.made = 0
    net, prop = relu_instance(*INSTANCE)
    graph = build_graph(net, (1, 4, 4), "mlp")
    atoms = [[(prop.spec[0, k].float(), 0.0) for k in range(prop.spec.shape[1])]]
    return vnncomp._verify_conjunctions(default_registry(), Mlp(graph, net), prop.lower,
                                        prop.upper, atoms, "bab",
                                        {"timeout": LIMIT, "clock": "cpu"})  # fmt: skip


def test_the_one_atom_route_keeps_all_the_time_until_its_search_stalls(monkeypatch):
    """The best atom's search is given all the time left (before: ``ONE_ATOM_SHARE``, half
    of it), and a stall ends the route at once: no other atom is searched, and the joint
    search, with the time left, refutes the conjunction (``unsat``, margin > 0)."""
    monkeypatch.setitem(CLOCKS, "cpu", FakeClock())  # no deadline passes
    monkeypatch.setattr(vnncomp, "PROBE_SHARE", 0.0)  # the probe: no time, no rival lead
    monkeypatch.setattr(vnncomp, "StallWatch", StallsAtSecondReport)
    given = []

    def recorded(registry, name, settings):
        given.append(settings["timeout"])
        return make_verifier(registry, name, settings)

    monkeypatch.setattr(vnncomp, "make_verifier", recorded)
    result = conjunction_route()
    assert StallsAtSecondReport.made == 1
    assert given == [LIMIT, LIMIT]  # the checker, then the one atom's: all the time left
    assert result.status == "unsat" and result.margin > 0


def test_the_joint_search_probes_first_then_gets_the_time_left(monkeypatch):
    """The joint search runs first within ``PROBE_SHARE`` of the time left (on a clock that
    never moves, its whole share: it refutes the conjunction there, and no atom is
    searched alone); its deadline is the share, not the whole limit."""
    monkeypatch.setitem(CLOCKS, "cpu", FakeClock())
    deadlines = []
    real = vnncomp._joint

    def recorded(checker, net, prop, first, deadline):
        deadlines.append(deadline.left())
        return real(checker, net, prop, first, deadline)

    monkeypatch.setattr(vnncomp, "_joint", recorded)
    monkeypatch.setattr(vnncomp, "StallWatch", StallsAtSecondReport)
    result = conjunction_route()
    assert deadlines == [vnncomp.PROBE_SHARE * LIMIT]
    assert StallsAtSecondReport.made == 0
    assert result.status == "unsat" and result.margin > 0


@pytest.mark.parametrize("ran", [True, False])
def test_the_atom_route_has_a_rival_exactly_where_the_probe_ran(monkeypatch, ran):
    """The probe's ``ran`` field, not its reason text, says whether the atom's search has
    a rival: a probe that ran and stopped short for any reason (even one worded as ``not
    run``) is a rival; one that did not apply is none."""
    monkeypatch.setitem(CLOCKS, "cpu", FakeClock())
    probe = JointOutcome(-1.0, None, "not run: worded so on purpose", ran=ran)
    monkeypatch.setattr(vnncomp, "_joint", lambda *args: probe)
    rivals = []

    def no_atom_refutes(*args):
        rivals.append(args[-1])
        return False, -math.inf, None, None

    monkeypatch.setattr(vnncomp, "_refuted_by_one_atom", no_atom_refutes)
    result = conjunction_route()
    assert rivals == ([(0.0, -1.0)] if ran else [None])
    assert result.status == "unknown" and result.margin == -1.0


def test_the_probe_does_not_run_without_a_bab_family_verifier():
    """``_joint`` with a verifier that has no joint search: the atoms' first-pass bound,
    marked as not run."""
    net, prop = relu_instance(*INSTANCE)
    graph = build_graph(net, (1, 4, 4), "mlp")
    checker = make_verifier(default_registry(), "lp-full", {"timeout": LIMIT})
    first = torch.tensor([-2.0, -1.0], dtype=torch.float64)
    outcome = vnncomp._joint(checker, Mlp(graph, net), prop, first, checker.deadline(1))
    assert not outcome.ran and outcome.point is None and outcome.margin == -1.0


@pytest.mark.parametrize("verifier, relu", [("lp-full", True), ("bab", False), ("complete", False)])
def test_the_probe_says_what_it_lacks_for_the_verifier_and_network_it_has(verifier, relu):
    """The reason was "it needs a ReLU network" for any verifier: false for one outside the
    ``bab`` family on a ReLU network (the note of an open disjunct carries it)."""
    net, prop = relu_instance(*INSTANCE)
    if not relu:
        net = scaled_mlp(1, 3.0, [16, 12, OUTPUTS], [torch.nn.Sigmoid])
    graph = build_graph(net, (1, 4, 4), "mlp")
    checker = make_verifier(default_registry(), verifier, {"timeout": LIMIT})
    first = torch.tensor([-2.0, -1.0], dtype=torch.float64)
    outcome = vnncomp._joint(checker, Mlp(graph, net), prop, first, checker.deadline(1))
    assert not outcome.ran and outcome.margin == -1.0
    if relu:
        assert outcome.why == (
            "not run: it is branch and bound's ('bab' or 'complete'), and verifier "
            "'lp-full' is not of that family"
        )
    else:
        assert outcome.why == "not run: it needs a ReLU network (model 'mlp' has sigmoid or tanh)"
