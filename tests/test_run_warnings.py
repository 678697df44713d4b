"""A run's ``AISafetyWarning``\\ s are stored with it (``run_warnings``), unit by unit where
they belong to one, identical ones of a unit once, and the report shows them; they are still
printed as the warning filters say (tests/test_warning_log.py). On Ray:
tests/test_scale_out.py."""

from __future__ import annotations

import warnings

import pytest
from test_at_chance import blind

from aisafety.config import plan_from_dict
from aisafety.errors import AISafetyWarning, TamperingError
from aisafety.evaluation.metrics.accuracy import AdversarialAccuracyWhiteBox
from aisafety.prediction.torch_module import TorchPredictor
from aisafety.report_page import build_report
from aisafety.runner import Runner
from aisafety.store.results import ResultStore

CHANCE = "not above chance"


def _run(tmp_path, model=None, url=None, **plan):
    fields = {"device": "cpu", "metrics": ["ca"], "dataset": {"limit": 40}, **plan}
    store = ResultStore(url or f"sqlite:///{tmp_path / 'r.db'}")
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        record = Runner(plan_from_dict(fields, "p"), store, quiet=True, model=model).run()
    return store, record.run_id, [str(w.message) for w in shown]


def _rows(store: ResultStore) -> list[tuple]:
    return store.query("SELECT run_id, unit_key, category, message FROM run_warnings")[1]


def test_a_run_at_chance_stores_its_warning_and_the_report_shows_it(tmp_path):
    model = TorchPredictor(blind(), (1, 28, 28), 10, name="blind")  # class 0: 4 of 40 images
    store, run_id, shown = _run(tmp_path, (model, "blind"))
    ((run, unit, category, message),) = _rows(store)
    # the run's own, stored as its own class (session 21; before: "AISafetyWarning")
    assert (run, unit, category) == (run_id, None, "AtChanceWarning")
    assert message.startswith("model 'blind' has clean accuracy 0.100 (4/40)") and CHANCE in message
    assert [m for m in shown if CHANCE in m] == [message]  # still printed, once
    html = build_report(store, run_id)
    assert '<section id="warnings"' in html and "<td>the run</td>" in html
    assert '<a class="badge warn" href="#warnings"' in html and ">1 warning: at chance</a>" in html
    assert "clean accuracy 0.100 (4/40) on the plan&#39;s images, not above chance" in html


def test_a_run_without_warnings_stores_none_and_the_report_has_no_warnings_section(tmp_path):
    store, run_id, shown = _run(tmp_path)  # the zoo's mnist-cnn, 99% clean accuracy
    assert _rows(store) == [] and not [m for m in shown if CHANCE in m]
    assert '<section id="warnings"' not in build_report(store, run_id)


def _warning_metric(monkeypatch, *messages: str) -> None:
    """aaw warns ``messages`` each time it computes (once per unit), then computes."""
    original = AdversarialAccuracyWhiteBox.compute

    def compute(self, ctx, spec, eps):
        for message in messages:
            warnings.warn(message, AISafetyWarning, stacklevel=2)
        return original(self, ctx, spec, eps)

    monkeypatch.setattr(AdversarialAccuracyWhiteBox, "compute", compute)


@pytest.mark.parametrize("server", ["sqlite", "postgresql"])
def test_a_units_warnings_are_its_own_and_identical_ones_are_stored_once(
    server, tmp_path, monkeypatch, request
):
    _warning_metric(monkeypatch, "same", "same", "other", "same")
    plan = {"attacks": [{"name": "fgsm", "eps": [0.1, 0.2]}], "metrics": ["ca", "aaw"]}
    url = request.getfixturevalue("postgres_url") if server == "postgresql" else None
    store, run_id, shown = _run(tmp_path, url=url, **plan)
    _, rows = store.query(
        "SELECT u.description, w.message FROM run_warnings w JOIN units u ON u.key = w.unit_key "
        "ORDER BY w.id"
    )
    assert rows == [
        ("fgsm eps=0.1", "same"),
        ("fgsm eps=0.1", "other"),
        ("fgsm eps=0.2", "same"),
        ("fgsm eps=0.2", "other"),
    ]
    assert store.run_warnings(run_id) == [(u, "AISafetyWarning", m) for u, m in rows]
    assert shown.count("same") == 6  # printed as the filters say ("always" here)


def test_a_failed_units_warnings_are_kept_with_its_key(tmp_path, monkeypatch):
    def tampering(self, ctx, spec, eps):
        warnings.warn("before the failure", AISafetyWarning, stacklevel=2)
        raise TamperingError("changed its inputs")

    monkeypatch.setattr(AdversarialAccuracyWhiteBox, "compute", tampering)
    plan = {"attacks": [{"name": "fgsm", "eps": [0.1]}], "metrics": ["ca", "aaw"]}
    store, run_id, _ = _run(tmp_path, **plan)
    ((key,),) = store.query("SELECT key FROM unit_failures")[1]
    assert _rows(store) == [(run_id, key, "AISafetyWarning", "before the failure")]
