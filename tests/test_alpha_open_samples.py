"""alpha-CROWN searches only the samples CROWN leaves open (#33): certified samples keep
CROWN's bound, coefficients and boxes; open ones get what a search of them alone gives;
with every sample certified no search runs. Layerwise (ReLU, conv) and joint (sigmoid)."""

from __future__ import annotations

import pytest
import torch

from aisafety.verification import bounds as b
from aisafety.verification import incomplete
from aisafety.verification.complete import REFINED_NOTE, CompleteVerifier
from aisafety.verification.graph import build_graph
from aisafety.verification.incomplete import AlphaCrownVerifier
from aisafety.verification.property import Property
from aisafety.verification.result import Verdict
from tests.test_joint_alpha import NETS
from tests.test_sshape_relaxation import around, sampled_minimum

STEPS = 10
# eps where CROWN certifies some of the 6 samples and leaves others open (measured)
PARTLY = {"relu": 0.08, "conv": 0.02, "sshape": 0.17}


def _counted(monkeypatch) -> list[int]:
    """The batch sizes the slope searches (layerwise and joint) are given."""
    seen = []
    real_layer, real_joint = b.optimise_slopes, incomplete.joint_alpha

    def layer(graph, boxes, spec, *args, **kwargs):
        seen.append(spec.shape[0])
        return real_layer(graph, boxes, spec, *args, **kwargs)

    def joint(graph, crown, spec, *args, **kwargs):
        seen.append(spec.shape[0])
        return real_joint(graph, crown, spec, *args, **kwargs)

    monkeypatch.setattr(b, "optimise_slopes", layer)
    monkeypatch.setattr(incomplete, "joint_alpha", joint)
    return seen


def _setup(kind: str, eps: float):
    make, _ = NETS[kind]
    net = make()
    graph = build_graph(net, (1, 4, 4), kind)
    x, prop = around(net, eps)
    p = prop.to(graph.dtype)
    boxes = b.linear_boxes(graph, p.lower, p.upper)
    crown, coeff = b.spec_lower(graph, boxes, p.spec)
    crown = torch.maximum(crown, b.ibp_spec_lower(graph, boxes, p.spec))
    return net, x, prop, graph, p, boxes, crown, coeff


@pytest.mark.parametrize("kind", sorted(PARTLY))
def test_only_open_samples_are_searched(kind, monkeypatch):
    net, x, prop, graph, p, crown_boxes, crown, crown_coeff = _setup(kind, PARTLY[kind])
    open_ = ~(crown + p.offset > 0).all(1)
    assert 0 < int(open_.sum()) < len(p)  # the case under test
    verifier = AlphaCrownVerifier(steps=STEPS, joint_steps=STEPS)
    seen = _counted(monkeypatch)
    root = verifier.bounds_and_boxes(graph, p)
    assert seen == [int(open_.sum())]
    done = ~open_
    assert torch.equal(root.bound[done], crown[done])
    assert torch.equal(root.coeff[done], crown_coeff[done])
    for (lo, hi), (c_lo, c_hi) in zip(root.boxes, crown_boxes, strict=True):
        assert torch.equal(lo[done], c_lo[done]) and torch.equal(hi[done], c_hi[done])
    # alone: CROWN's float64 boxes of the smaller batch differ in the last bits (1.8e-15
    # measured on sshape: the matmuls' summation order depends on the batch size)
    alone = verifier.bounds_and_boxes(graph, p[open_])
    close = lambda u, v: torch.allclose(u, v, rtol=0, atol=1e-9)  # noqa: E731
    assert close(root.bound[open_], alone.bound) and close(root.coeff[open_], alone.coeff)
    for (lo, hi), (a_lo, a_hi) in zip(root.boxes, alone.boxes, strict=True):
        assert close(lo[open_], a_lo) and close(hi[open_], a_hi)
    assert (root.bound >= crown).all()
    assert (root.bound + p.offset <= sampled_minimum(net, x, prop) + 1e-9).all()


@pytest.mark.parametrize("kind", ["relu", "sshape"])
def test_no_search_when_crown_certifies_every_sample(kind, monkeypatch):
    _, _, _, graph, p, crown_boxes, crown, crown_coeff = _setup(kind, 0.01)
    assert (crown + p.offset > 0).all()
    seen = _counted(monkeypatch)
    root = AlphaCrownVerifier(steps=STEPS, joint_steps=STEPS).bounds_and_boxes(graph, p)
    assert seen == []
    assert torch.equal(root.bound, crown) and torch.equal(root.coeff, crown_coeff)
    for (lo, hi), (c_lo, c_hi) in zip(root.boxes, crown_boxes, strict=True):
        assert torch.equal(lo, c_lo) and torch.equal(hi, c_hi)


def _stops(monkeypatch, dues: list | None = None) -> list[int]:
    """The steps run at each stop of the layerwise output search (``slope_stops``), and
    into ``dues`` the samples due at each."""
    seen, real = [], b.slope_stops

    def counted(*args, **kwargs):
        for stop in real(*args, **kwargs):
            seen.append(stop.steps)
            if dues is not None:
                dues.append(stop.due.clone())
            yield stop  # the caller's ``certified`` reaches the search through it

    monkeypatch.setattr(b, "slope_stops", counted)
    return seen


def _certifiable():
    """relu net at eps 0.15 on alpha-CROWN's boxes, each sample's rows offset so that its
    threshold lies a quarter of the way from CROWN's worst row to 50 output steps' worst
    (as a VNN-COMP spec's offsets place it): open to CROWN, certified by the search."""
    net, x, prop, graph, p, _, _, _ = _setup("relu", 0.15)
    boxes = AlphaCrownVerifier(steps=20).boxes(graph, p)
    crown = b.spec_lower(graph, boxes, p.spec)[0].amin(1)
    full = b.optimise_slopes(graph, boxes, p.spec, 50, 0.1)[0].amin(1)
    assert (full - crown > 0.04).all()  # room for the stop margin (0.02 + 0.01 |bound|)
    shift = (-(3 * crown + full) / 4).unsqueeze(1).expand_as(p.offset)
    moved = Property(p.lower, p.upper, p.spec, p.offset + shift)
    return net, x, Property(prop.lower, prop.upper, prop.spec, moved.offset), graph, moved, boxes


def test_output_search_stops_early_once_every_sample_leads(monkeypatch):
    """With the rows' offset each sample's output search stops once its worst row leads
    the stop margin, and the sound pass of those slopes certifies it: every sample is due
    once, the last before step 50; without the offset all 50 run."""
    net, x, prop, graph, p, boxes = _certifiable()
    dues = []
    seen = _stops(monkeypatch, dues)
    full, _ = b.optimise_slopes(graph, boxes, p.spec, 50, 0.1)
    assert seen == [50]
    assert not (b.spec_lower(graph, boxes, p.spec)[0] + p.offset > 0).all(1).any()
    seen.clear()
    dues.clear()
    early, _ = b.optimise_slopes(graph, boxes, p.spec, 50, 0.1, p.offset)
    assert seen[-1] < 50 and torch.equal(torch.stack(dues).sum(0), torch.ones(len(p)).long())
    assert (early + p.offset > 0).all()
    assert (early + p.offset <= sampled_minimum(net, x, prop) + 1e-9).all()
    assert (full + p.offset <= sampled_minimum(net, x, prop) + 1e-9).all()


def test_an_output_stop_the_sound_pass_does_not_confirm_resumes(monkeypatch):
    """A negative stop margin stops before the slopes certify: the sound pass does not,
    so the search resumes (same Adam state, margin doubled) until one that certifies."""
    net, x, prop, graph, p, boxes = _certifiable()
    monkeypatch.setattr(b, "STOP_ABS", -0.5)
    dues = []
    seen = _stops(monkeypatch, dues)
    bound, _ = b.optimise_slopes(graph, boxes, p.spec, 50, 0.1, p.offset)
    assert len(seen) > 1 and seen == sorted(set(seen)) and seen[-1] < 50
    assert (torch.stack(dues).sum(0) > 1).any()  # a sample's stop that did not certify
    assert (bound + p.offset > 0).all()
    assert (bound + p.offset <= sampled_minimum(net, x, prop) + 1e-9).all()


def test_a_resumed_output_search_keeps_each_rows_highest_sound_bound(monkeypatch):
    """Every stop's sound pass is a bound: a later one lower on a row (its slopes led by
    the search's unrounded bound only) must not replace an earlier, higher one. Forced:
    every sound pass of searched slopes but the second stop's (above CROWN's here; the
    first is CROWN's slopes) is lowered by 10, so each row keeps the higher of CROWN's
    and the second stop's."""
    net, x, prop, graph, p, boxes = _certifiable()
    monkeypatch.setattr(b, "STOP_ABS", -0.5)  # stops that do not certify: resumes
    real, seen = b.sound_backward, []

    def lowered(*args, **kwargs):
        bound, coeff = real(*args, **kwargs)
        if kwargs.get("slopes") is None:
            return bound, coeff
        seen.append(bound)
        return (bound if len(seen) == 2 else bound - 10.0), coeff

    monkeypatch.setattr(b, "sound_backward", lowered)
    crown = b.spec_lower(graph, boxes, p.spec)[0]
    bound, _ = b.optimise_slopes(graph, boxes, p.spec, 50, 0.1, p.offset)
    assert len(seen) > 2 and (seen[1] > crown).any()
    assert torch.equal(bound, torch.maximum(crown, seen[1]))
    assert (bound + p.offset <= sampled_minimum(net, x, prop) + 1e-9).all()


def test_intermediate_searches_keep_all_their_steps(monkeypatch):
    """Only the output search has a threshold: with the offset given to the verifier, the
    intermediate bounds' searches still run every step (their yields say ``steps``)."""
    _, _, _, graph, p, _, _, _ = _setup("relu", 0.07)
    seen = _stops(monkeypatch)
    AlphaCrownVerifier(steps=STEPS, joint=False).bounds_and_boxes(graph, p)
    assert seen[:-1] and all(s == STEPS for s in seen[:-1])  # the last is the output's


def test_completes_refined_search_stops_early_once_the_rows_certify(monkeypatch):
    """``complete``'s MILP path bounds again on its MILP-refined boxes with the rows'
    offset, so that search stops once the sound pass certifies (its last yield before
    ``alpha_steps``); verdict and soundness as with every step. Sample 0 of the relu net at
    eps 0.1: alpha-CROWN's root leaves it open, its MILP-refined boxes certify it
    (at the first step: 1 of 10 run; all 10 before #33's fix)."""
    net, x, prop, graph, _, _, _, _ = _setup("relu", 0.1)
    one = prop[:1]
    verifier = CompleteVerifier(engine="milp", refine_share=0.5, alpha_steps=STEPS,
                                timeout=60, clock="cpu")  # fmt: skip
    root = verifier.bounds_and_boxes(graph, one.to(graph.dtype))
    assert float((root.bound + one.offset).min()) < 0  # open at the root: refinement runs
    seen = _stops(monkeypatch)
    result = verifier.verify(graph, one, net)
    assert result.verdicts == [Verdict.CERTIFIED]
    # a certificate on MILP-refined boxes says they rest on HiGHS's MIP bound (session 16;
    # tests/test_refine_bounds.py checks the boxes and the flag that sets this note)
    assert result.notes == [REFINED_NOTE]
    assert seen[-1] < STEPS  # the refined search's last stop: before its last step
    assert result.margins[0] <= sampled_minimum(net, x[:1], one).min() + 1e-6
