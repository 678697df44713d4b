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

import pytest
from verdict_contradictions import contradictions

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
