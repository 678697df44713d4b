"""No verdict of ours contradicts alpha-beta-CROWN's on the VNN-COMP 2021 mnistfc and eran sets.

alpha-beta-CROWN (8250d5f, its CPU branch and bound, 60 s of CPU per instance) ran here
beside our ``complete`` (``bench/abcrown/run.py``, ``bench/verification.py --out``); the
verdicts of both are kept in ``bench/abcrown/verdicts.jsonl``, each alpha-beta-CROWN ``sat``
with whether its counterexample replayed under onnxruntime. ``bench/sweep_report.py``
checks a sweep: no ``unsat`` beside a replayed ``sat`` (testkit/verdict_contradictions.py).
Here: that check on hand-made rows, on the kept sweep, and live, our ``complete`` now
against alpha-beta-CROWN's kept verdicts on three instances it settles fast (one ``sat``,
two ``unsat``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from verdict_contradictions import contradictions
from vnncomp_cifar10 import moved_into_box

from aisafety.plugins import default_registry
from aisafety.verification.vnncomp import verify_instance
from tests.shared_data import absent, located

ROOT = Path(__file__).resolve().parents[1]
KEPT = ROOT / "bench" / "abcrown" / "verdicts.jsonl"
MNISTFC = located("vnncomp2021_mnistfc")
SHARED = MNISTFC.parent if MNISTFC else None


def kept_rows() -> list[dict]:
    return [json.loads(line) for line in KEPT.read_text().splitlines() if line]


def row(tool: str, status: str, prop: str = "p", **extra) -> dict:
    return {"net": "n", "property": prop, "tool": tool, "status": status, "cpu_s": 1.0, **extra}


def test_the_check_flags_an_unsat_beside_a_replayed_sat_and_nothing_else():
    found, _ = contradictions([row("ours", "unsat"), row("abcrown", "sat")])
    assert found == ["n p: unsat by ['ours'], sat by ['abcrown']"]
    agreeing = [row("ours", "unsat"), row("abcrown", "unsat"), row("ours", "sat", "q"),
                row("abcrown", "timeout", "q"), row("box-pgd", "unknown")]  # fmt: skip
    assert contradictions(agreeing) == ([], [])
    # a sat whose counterexample did not replay refutes nothing; it is listed apart
    found, unreplayed = contradictions(
        [row("ours", "unsat"), row("abcrown", "sat", cex_replays=False)]
    )
    assert found == [] and unreplayed == ["n p (abcrown)"]


def test_the_kept_sweep_has_no_contradiction_and_every_sat_of_alpha_beta_crown_replays():
    rows = kept_rows()
    assert {r["tool"] for r in rows} >= {"abcrown", "complete"}
    found, unreplayed = contradictions(rows)
    assert found == [] and unreplayed == []
    assert all(
        r.get("cex_replays") for r in rows if r["tool"] == "abcrown" and r["status"] == "sat"
    )


def test_a_peer_point_one_float32_step_outside_the_box_is_moved_in_and_no_further(tmp_path):
    """alpha-beta-CROWN writes float32 inputs; on a box end float32 cannot hold (0.7 rounds
    down to 0.69999999, 0.1 up to 0.10000000149) its point lies one step outside. Those
    inputs move that one step in; one further out stays, so its replay still fails."""
    spec = tmp_path / "p.vnnlib"
    spec.write_text(
        "(declare-const X_0 Real)\n(declare-const X_1 Real)\n(declare-const Y_0 Real)\n"
        "(declare-const Y_1 Real)\n(assert (>= X_0 0.7))\n(assert (<= X_0 0.9))\n"
        "(assert (>= X_1 -0.5))\n(assert (<= X_1 0.1))\n(assert (>= Y_0 Y_1))\n"
    )
    below, above = float(np.float32(0.7)), float(np.float32(0.1))
    assert below < 0.7 and above > 0.1  # outside, each by one float32 step
    moved, count = moved_into_box(spec, f"((X_0 {below})\n (X_1 {above})\n (Y_0 1.0)\n (Y_1 2.0))")
    values = dict(line.strip("() ").split() for line in moved.splitlines())
    assert count == 2
    assert float(values["X_0"]) == float(np.nextafter(np.float32(below), np.float32(1)))
    assert float(values["X_0"]) >= 0.7 and float(values["X_1"]) <= 0.1
    assert values["Y_0"] == "1.0" and values["Y_1"] == "2.0"
    far = float(np.nextafter(np.float32(below), np.float32(0)))  # two steps below 0.7
    moved, count = moved_into_box(spec, f"((X_0 {far})\n (X_1 0.0)\n (Y_0 1.0)\n (Y_1 2.0))")
    assert count == 0 and dict(line.strip("() ").split() for line in moved.splitlines())[
        "X_0"
    ] == repr(far)


FAST = [("mnist-net_256x2", "prop_7_0.03.vnnlib"), ("mnist-net_256x2", "prop_0_0.03.vnnlib"),
        ("mnist_relu_9_200", "mnist_spec_idx_8098_eps_0.01500.vnnlib")]  # fmt: skip


@pytest.mark.skipif(SHARED is None, reason=absent("vnncomp2021_mnistfc"))
@pytest.mark.parametrize(("net", "prop"), FAST)
def test_our_complete_now_never_contradicts_alpha_beta_crowns_kept_verdict(net, prop):
    theirs = [
        r
        for r in kept_rows()
        if r["tool"] == "abcrown" and (r["net"], r["property"]) == (net, prop)
    ]
    assert theirs and theirs[0]["status"] in ("sat", "unsat"), (net, prop)
    folder = SHARED / ("vnncomp2021_mnistfc" if "256x" in net else "vnncomp2021_eran")
    network = next(folder.rglob(f"{net}.onnx"))
    spec = next(folder.rglob(prop))
    ours = verify_instance(default_registry(), network, spec, "complete", 30.0, {"clock": "cpu"})
    rows = theirs + [{"net": net, "property": prop, "tool": "complete", "status": ours.status}]
    assert contradictions(rows) == ([], []), (ours.status, ours.note)
    assert ours.status == theirs[0]["status"], "both settle it well within the limit"
