"""Verifiers on the VNN-COMP 2021 mnistfc and eran instances, ONNX through a plan, `verify`.

Soundness: on every instance (a few in the default run, all with ``-m slow``; ``bab`` on two
256x2 instances in the default run) no verifier
certifies what our PGD breaks or another verifier falsified (a replayed counterexample), and
every bound (per spec row, and each verdict's proved margin) is below the true margin at the
box centre, at 1,000 random points of the box and at the attack's point. The slow sweep runs
per network with ``-k``, e.g. ``pytest -m slow tests/test_verification_vnncomp.py -k 256x6``.
"""

from __future__ import annotations

import csv
import re
from functools import lru_cache
from pathlib import Path

import pytest
import torch

from aisafety.cli import main
from aisafety.plugins import default_registry
from aisafety.prediction.onnx_model import load_onnx
from aisafety.verification.falsify import into_box
from aisafety.verification.graph import build_graph
from aisafety.verification.registry import make_verifier
from aisafety.verification.result import Verdict
from aisafety.verification.vnnlib import read_vnnlib
from tests.shared_data import absent, located

MNISTFC = located("vnncomp2021_mnistfc")
SHARED = MNISTFC.parent if MNISTFC else None
pytestmark = pytest.mark.skipif(SHARED is None, reason=absent("vnncomp2021_mnistfc"))


def instances() -> list[tuple[Path, Path]]:
    found = []
    if SHARED is None:
        return found
    for folder, table in (("vnncomp2021_mnistfc", "mnistfc_instances.csv"),
                          ("vnncomp2021_eran", "eran_instances.csv")):  # fmt: skip
        with (SHARED / folder / table).open() as f:
            found += [(SHARED / folder / r[0], SHARED / folder / r[1]) for r in csv.reader(f) if r]
    return found


ALL = instances()
# one instance per network for the default run
QUICK = [next(i for i in ALL if i[0].name == name) for name in sorted({n.name for n, _ in ALL})]


@lru_cache(maxsize=8)
def network(path: Path):
    shape = (1, 28, 28)
    predictor = load_onnx(path, gradients=True, input_shape=shape)
    return predictor, build_graph(predictor.network.cpu(), shape, path.name)


def instance(net: Path, spec: Path):
    predictor, graph = network(net)
    prop = read_vnnlib(spec, 784, 10)
    prop.lower, prop.upper = prop.lower.reshape(1, 1, 28, 28), prop.upper.reshape(1, 1, 28, 28)
    eps = float(spec.stem.rsplit("_", 1)[1])  # prop_7_0.03, mnist_spec_idx_8098_eps_0.01500
    x = torch.where(prop.upper < 1, prop.upper - eps, prop.lower + eps).clamp(0, 1).float()
    label = int((prop.spec[0] > 0).float().sum(0).argmax())  # e_y - e_j in every row
    return predictor, graph, prop, x, label, eps


def check_instance(net: Path, spec: Path, verifiers: list[str], timeout: float = 10.0) -> None:
    predictor, graph, prop, x, label, eps = instance(net, spec)
    pgd = default_registry().create("attack", "pgd-linf", {"steps": 50})
    adversarial = into_box(pgd(predictor, x, torch.tensor([label]), eps).x_adv, prop)
    generator = torch.Generator().manual_seed(0)
    noise = torch.rand(1000, *x.shape[1:], generator=generator, dtype=torch.float64)
    points = torch.cat([(prop.lower + prop.upper) / 2, adversarial.double(),
                        prop.lower + noise * (prop.upper - prop.lower)]).float()  # fmt: skip
    with torch.no_grad():
        rows = prop.rows(predictor.logits(points).double())  # (points, K)
    broken = bool((rows[1] <= 0).any())
    verdicts = {}
    for name in verifiers:
        # CPU seconds: under load a wall limit cut alpha-CROWN's sigmoid slopes short (#33)
        verifier = make_verifier(default_registry(), name, {"timeout": timeout, "clock": "cpu"})
        bounds = record_bounds(verifier)
        result = verifier.verify(graph, prop, predictor.logits)
        verdicts[name] = result.verdicts[0]
        assert not (broken and result.verdicts[0] is Verdict.CERTIFIED), (name, spec.name)
        if result.verdicts[0] is Verdict.FALSIFIED:
            point = result.counterexamples
            assert prop.inside(point).all() and predictor.logits(point).argmax(1).item() != label
        else:  # the margin is a proved lower bound (a falsified one is the point's value)
            assert result.margins[0] <= rows.amin() + 1e-5, (name, spec.name)
        if name != "complete":  # the per-row bounds behind the verdict
            # an attack-first verifier bounds nothing its box-PGD broke
            attacked = verifier.attack_first and result.verdicts[0] is Verdict.FALSIFIED
            assert len(bounds) == (0 if attacked and not bounds else 1), (name, len(bounds))
            for found in bounds:
                assert (found[0] + prop.offset[0] <= rows.amin(0) + 1e-6).all(), (name, spec.name)
    # a counterexample one verifier replayed refutes every certificate of the others
    found = set(verdicts.values())
    assert not {Verdict.CERTIFIED, Verdict.FALSIFIED} <= found, (spec.name, verdicts)


def record_bounds(verifier) -> list[torch.Tensor]:
    """The spec-row lower bounds ``verify`` computes (one tensor per batch, from
    ``noted_bounds``, which ``verify`` calls), kept for the check instead of bounding the
    instance a second time."""
    found: list[torch.Tensor] = []
    compute = verifier.noted_bounds

    def recorded(graph, prop):
        bounds, coeff, notes = compute(graph, prop)
        found.append(bounds.detach())
        return bounds, coeff, notes

    verifier.noted_bounds = recorded
    return found


@pytest.mark.parametrize(("net", "spec"), QUICK, ids=[f"{n.stem}-{s.stem}" for n, s in QUICK])
def test_no_verifier_certifies_what_pgd_breaks_and_bounds_stay_below_the_margin(net, spec):
    check_instance(net, spec, ["ibp", "crown-ibp", "crown"])


@pytest.mark.slow
@pytest.mark.parametrize(("net", "spec"), ALL, ids=[f"{n.stem}-{s.stem}" for n, s in ALL])
def test_every_instance_is_sound_for_every_verifier(net, spec):
    names = ["ibp", "crown-ibp", "fast-lin", "crown", "alpha-crown", "complete", "bab"]
    check_instance(net, spec, names)


@pytest.mark.parametrize("spec", ["prop_2_0.03.vnnlib", "prop_7_0.03.vnnlib"])
def test_bab_agrees_with_the_milp_on_an_unsat_and_a_sat_256x2_instance(spec):
    """Branch and bound beside the MILP (``complete`` on 256x2) on one instance of each
    answer; ``check_instance`` also checks bab's per-row bounds against 1,002 points."""
    folder = SHARED / "vnncomp2021_mnistfc"
    check_instance(folder / "mnist-net_256x2.onnx", folder / spec, ["complete", "bab"], 30.0)


def test_verify_prints_unsat_and_sat_with_a_counterexample_that_replays(capsys):
    folder = SHARED / "vnncomp2021_mnistfc"
    net = str(folder / "mnist-net_256x2.onnx")
    assert main(["verify", net, str(folder / "prop_2_0.03.vnnlib"), "--timeout", "30"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "unsat"
    assert main(["verify", net, str(folder / "prop_7_0.03.vnnlib"), "--timeout", "30"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "sat"
    xs = [float(v) for v in re.findall(r"\(X_\d+ ([^)]+)\)", out)]
    ys = [float(v) for v in re.findall(r"\(Y_\d+ ([^)]+)\)", out)]
    assert len(xs) == 784 and len(ys) == 10
    predictor, _, prop, _, label, _ = instance(folder / "mnist-net_256x2.onnx",
                                               folder / "prop_7_0.03.vnnlib")  # fmt: skip
    x = torch.tensor(xs).reshape(1, 1, 28, 28)
    assert prop.inside(x).all()
    assert predictor.logits(x).argmax(1).item() != label


def test_verify_prints_timeout_and_unknown(capsys):
    folder = SHARED / "vnncomp2021_mnistfc"
    net, spec = str(folder / "mnist-net_256x2.onnx"), str(folder / "prop_1_0.03.vnnlib")
    # the hardest 256x2 instance: not settled in 60 s, so its MILP runs out of 0.5 s
    assert main(["verify", net, spec, "--timeout", "0.5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "timeout" and "# note: timeout" not in lines  # no echo of the status
    # IBP certifies no mnistfc instance and finds no counterexample here
    assert main(["verify", net, spec, "--verifier", "ibp"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "unknown"


def test_verify_prints_no_note_that_only_repeats_the_status():
    """A search cut off by its limit carries the note 'timeout': ``aisafety verify`` printed
    it under the status line 'timeout' as '# note: timeout' (vnn-21); a note that says more
    (why loading took the whole limit) is still printed."""
    from argparse import Namespace

    from aisafety.cli.verify import summary
    from aisafety.verification.vnncomp import InstanceResult

    args = Namespace(verifier="crown", timeout=1.0, clock="wall")
    bare = InstanceResult("timeout", 1.0, -float("inf"), note="timeout", how="crown")
    assert "note" not in summary(bare, args, 1.0)
    why = "timeout (loading the instance took the whole limit)"
    told = InstanceResult("timeout", 1.0, -float("inf"), note=why, how="crown")
    assert summary(told, args, 1.0).splitlines()[1] == f"# note: {why}"


def test_certified_accuracy_with_crown_on_an_onnx_network_through_a_plan(tmp_path):
    from aisafety.config import plan_from_dict
    from aisafety.runner import Runner
    from aisafety.store.results import ResultStore

    plan = plan_from_dict({
        "model": {"source": "onnx", "name": "mnistfc-256x2", "gradients": True,
                  "path": str(SHARED / "vnncomp2021_mnistfc" / "mnist-net_256x2.onnx"),
                  "input_shape": [1, 28, 28]},
        "dataset": {"name": "mnist-embedded", "limit": 10},
        # every sample verified (attack_first off), so every row has its proved margin
        "metrics": [{"name": "certified-accuracy",
                     "config": {"verifier": "crown", "eps": 0.02, "attack_first": False}}],
    })  # fmt: skip
    store = ResultStore(f"sqlite:///{tmp_path / 'r.db'}")
    record = Runner(plan, store, quiet=True).run()
    (value,) = [v for v in record.values if v.metric.startswith("certified-accuracy")]
    assert 0 < value.value <= value.details["attack_upper_bound"]
    _, rows = store.query("select verdict, margin from verification_samples")
    assert len(rows) == 10
    assert sum(v == "certified" for v, _ in rows) == round(value.value * 10)
    assert all((m > 0) == (v == "certified") for v, m in rows)
