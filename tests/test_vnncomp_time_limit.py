"""A VNN-COMP instance's time limit covers loading it (``vnncomp.verify_instance``).

Before #33's eighth session the verifier's deadline started after the network was loaded
and the spec read, so that setup's CPU seconds came on top of the limit. The clock here is a
counter that only the patched loader advances: no wall-clock timing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aisafety.plugins import default_registry
from aisafety.verification import vnncomp
from aisafety.verification.base import Verifier
from aisafety.verification.deadline import CLOCKS

ROOT = Path(__file__).resolve().parents[1]
PLACES = (ROOT.parent / "shared" / "data", ROOT.parents[1] / "shared" / "data")
MNISTFC = next(
    (p / "vnncomp2021_mnistfc" for p in PLACES if (p / "vnncomp2021_mnistfc").is_dir()), None
)
pytestmark = pytest.mark.skipif(MNISTFC is None, reason="../shared/data (VNN-COMP files) absent")


def run_with_setup(
    monkeypatch, setup: float, timeout: float, prepare: float = 0.0, attack: float | None = None
):
    """``verify_instance`` (``crown``, CPU clock) whose loading costs ``setup`` ticks and
    the verifier's one-time ``prepare`` ``prepare`` ticks (and, given ``attack``, box-PGD
    ``attack`` ticks and no point); the result and the span of every deadline a verifier
    set."""
    ticks = [100.0]
    monkeypatch.setitem(CLOCKS, "cpu", lambda: ticks[0])
    load = vnncomp.load_network

    def slow_load(path):
        ticks[0] += setup
        return load(path)

    spans, make = [], Verifier.deadline

    def recorded(verifier, n, start=None):
        made = make(verifier, n, start)
        spans.append(made.at - ticks[0])
        return made

    def slow_prepare(verifier):
        ticks[0] += prepare

    def slow_attack(verifier, graph, prop, model):
        ticks[0] += attack
        return torch.zeros(len(prop), dtype=torch.bool), prop.lower

    if attack is not None:
        monkeypatch.setattr(vnncomp.BoxPgd, "attack", slow_attack)

    monkeypatch.setattr(vnncomp, "load_network", slow_load)
    monkeypatch.setattr(Verifier, "prepare", slow_prepare)
    monkeypatch.setattr(Verifier, "deadline", recorded)
    net, spec = MNISTFC / "mnist-net_256x2.onnx", MNISTFC / "prop_0_0.03.vnnlib"
    config = {"clock": "cpu"}
    return vnncomp.verify_instance(default_registry(), net, spec, "crown", timeout, config), spans


def test_the_verifier_gets_what_loading_left_of_the_limit(monkeypatch):
    result, spans = run_with_setup(monkeypatch, setup=45.0, timeout=60.0)
    # one sample: 60 - 45 ticks for box-PGD's deadline, then the bounds' with what it left
    # (all of it: only loading advances this clock). crown set one before it attacked first
    # on this route (session 21)
    assert spans == [pytest.approx(15.0)] * 2
    assert result.status in ("unsat", "unknown")  # crown's own verdict, not a timeout


def test_the_verifiers_one_time_prepare_counts_too(monkeypatch):
    """alpha-CROWN's ``prepare`` imports ``torch._dynamo`` (seconds of CPU) once per process:
    in a sweep of one instance per process, that is every instance's."""
    result, spans = run_with_setup(monkeypatch, setup=20.0, timeout=60.0, prepare=25.0)
    assert spans == [pytest.approx(15.0)] * 2  # box-PGD's, then the bounds'


def test_loading_past_the_limit_is_a_timeout_without_any_bound_work(monkeypatch):
    result, spans = run_with_setup(monkeypatch, setup=60.0, timeout=60.0)
    assert result.status == "timeout" and spans == []
    assert "loading" in result.note and result.margin == float("-inf")


def test_the_bounds_get_what_the_attack_first_step_left(monkeypatch):
    """crown attacks first on the one-atom route (session 21), within the same limit: box-PGD
    taking 4 of the 15 ticks loading left, the bounds get 11."""
    result, spans = run_with_setup(monkeypatch, setup=45.0, timeout=60.0, attack=4.0)
    assert spans == [pytest.approx(15.0), pytest.approx(11.0)]
    assert result.status in ("unsat", "unknown")
