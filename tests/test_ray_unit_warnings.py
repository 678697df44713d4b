"""On Ray a unit's warnings reach the driver, which prints them as a local run does, and are
stored under the unit's key: its attack shards' (``shard_size``) and those of a unit that
failed on its worker too (docs/database.md, ``run_warnings``). The task functions run here in
process (tasks.py imports no Ray); the driver's side (``_warn_unit``) needs Ray installed."""

from __future__ import annotations

import warnings
from contextlib import contextmanager

import pytest
import torch
from batch_as_constant import BatchAsConstant

from aisafety.config import plan_from_dict
from aisafety.distributed import tasks
from aisafety.errors import AISafetyWarning, TamperingError
from aisafety.evaluation.context import EvaluationContext
from aisafety.evaluation.metrics.accuracy import AdversarialAccuracyWhiteBox
from aisafety.store.results import ResultStore
from aisafety.version import __version__
from aisafety.warning_log import KeptWarning, WarningLog, keeping

FIELDS = {"device": "cpu", "dataset": {"limit": 20}, "metrics": ["ca", "aaw"]}
FGSM = [{"name": "fgsm", "eps": [0.1]}]


@contextmanager
def _started(tmp_path, **plan):
    """The plan, its store's URL, a run started as the driver starts it, and the attack unit
    and clean logits of the prepare task; the run finished afterwards."""
    plan = plan_from_dict({**FIELDS, "attacks": FGSM, **plan}, "p")
    url = f"sqlite:///{tmp_path / 'r.db'}"
    info, logits = tasks.prepare(plan, url, str(tmp_path))
    (attack_unit,) = [u for u in info["units"] if u.attack is not None]
    store = ResultStore(url)
    run_id = store.start_run(plan, __version__, "cpu")
    try:
        yield plan, url, run_id, attack_unit, logits
    finally:
        store.finish_run(run_id)


def _rows(url: str) -> list[tuple]:
    return ResultStore(url).query("SELECT unit_key, message FROM run_warnings ORDER BY id")[1]


def test_an_attack_shards_warnings_are_stored_with_its_unit_by_the_join(tmp_path, monkeypatch):
    """Each shard task returns its warnings; the join stores them with the unit (identical
    ones once) and returns them for the driver to print. Before raywarn-19 they were lost."""
    original = EvaluationContext.attack_shard

    def warning_shard(self, spec, eps, index):
        warnings.warn(f"shard {index}", AISafetyWarning, stacklevel=2)
        warnings.warn("every shard", AISafetyWarning, stacklevel=2)
        return original(self, spec, eps, index)

    monkeypatch.setattr(EvaluationContext, "attack_shard", warning_shard)
    with _started(tmp_path, shard_size=10, batch_size=10) as (plan, url, run_id, work, logits):
        common = (plan, url, str(tmp_path))
        outputs = [tasks.attack(*common, work.attack, work.eps, i, logits) for i in range(2)]
        results, warned = zip(*outputs, strict=True)
        _, _, kept = tasks.unit(*common, run_id, work, logits, {}, None, *results, *warned)
    assert [[w.message for w in kept] for _, kept in outputs] == [
        ["shard 0", "every shard"],
        ["shard 1", "every shard"],
    ]
    expected = [(work.key, "shard 0"), (work.key, "every shard"), (work.key, "shard 1")]
    assert [(w.unit_key, w.message) for w in kept] == expected
    assert _rows(url) == expected


def test_a_unit_that_fails_on_a_worker_takes_its_warnings_to_the_driver(tmp_path, monkeypatch):
    """The failed task's exception carries the unit's warnings (``unit_warnings``: the
    driver stores them under the unit's key); a later prepare on that worker does not hand
    them back as the run's own."""

    def tampering(self, ctx, spec, eps):
        warnings.warn("before the failure", AISafetyWarning, stacklevel=2)
        raise TamperingError("changed its inputs")

    monkeypatch.setattr(AdversarialAccuracyWhiteBox, "compute", tampering)
    with _started(tmp_path) as started, pytest.raises(TamperingError) as failed:
        plan, url, run_id, work, logits = started
        tasks.attack_unit(plan, url, str(tmp_path), run_id, work, logits)
    assert failed.value.unit_warnings == [
        KeptWarning(work.key, AISafetyWarning, "before the failure")
    ]
    info, _ = tasks.prepare(plan, url, str(tmp_path))  # the same worker's next run
    assert info["warnings"] == []


def test_the_driver_prints_a_units_warnings_but_keeps_them_out_of_the_runs():
    """``_warn_unit``: each warning shown as the filters say, returned under the unit's key
    (a shard's have none), and not added to the run's log (the worker stored them)."""
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'aisafety[distributed]'")
    from aisafety.distributed.executor import _warn_unit
    from aisafety.runner import WorkUnit

    unit = WorkUnit("k1", "fgsm eps=0.1")
    run = WarningLog()
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with keeping(run):
            kept = _warn_unit(unit, [KeptWarning(None, AISafetyWarning, "from a shard")])
    assert [str(w.message) for w in shown] == ["from a shard"]
    assert kept == [KeptWarning("k1", AISafetyWarning, "from a shard")]
    assert run.entries == []


def test_a_failed_shard_leaves_its_sibling_shards_warnings_with_the_unit(tmp_path, monkeypatch):
    """A shard that fails fails its join before the join runs, so the join's exception
    carries that shard's warnings only; the other shards' were dropped (raywarn-19's gap 1).
    ``failed_unit_warnings`` reads each shard's warnings too (as the driver does, with
    ``ray.get``; here each task's output or its exception wrapped as Ray wraps it)."""
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'aisafety[distributed]'")
    from ray.exceptions import RayTaskError

    from aisafety.distributed.executor import _warn_unit, failed_unit_warnings

    original = EvaluationContext.attack_shard

    def failing_shard(self, spec, eps, index):
        warnings.warn(f"shard {index}", AISafetyWarning, stacklevel=2)
        if index == 1:
            raise RuntimeError("shard 1 cannot be attacked")
        return original(self, spec, eps, index)

    monkeypatch.setattr(EvaluationContext, "attack_shard", failing_shard)
    with _started(tmp_path, shard_size=10, batch_size=10) as (plan, url, _, work, logits):
        shard0 = tasks.attack(plan, url, str(tmp_path), work.attack, work.eps, 0, logits)
        with pytest.raises(RuntimeError) as failed:
            tasks.attack(plan, url, str(tmp_path), work.attack, work.eps, 1, logits)
    shard1 = RayTaskError("attack", "", failed.value)  # what ray.get of either output raises
    outputs = {"warned 0": shard0[1], "warned 1": shard1}

    def get(ref):
        if isinstance(outputs[ref], Exception):
            raise outputs[ref]
        return outputs[ref]

    joined = shard1  # the join fails with its failed argument's error, before it runs
    kept = failed_unit_warnings(joined, ["warned 0", "warned 1"], get)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        stored = _warn_unit(work, kept)
    assert [(w.unit_key, w.message) for w in stored] == [
        (work.key, "shard 1"),
        (work.key, "shard 0"),
    ]


def test_a_unit_warning_with_a_run_warnings_text_prints_once_on_the_driver():
    """The driver raises every worker warning again from one line, so the default filter
    (once per text, category and line, per run) shows a text once, as a local run shows a
    warning raised at one place. Two call sites (the prepare task's and a unit's) printed
    it twice (raywarn-19's gap 2); what is kept is unchanged: the run's and each unit's."""
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'aisafety[distributed]'")
    from aisafety.distributed.executor import _warn_again, _warn_unit
    from aisafety.runner import WorkUnit

    same = KeptWarning(None, AISafetyWarning, "a forward pass")
    run = WarningLog()
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")
        with keeping(run):
            _warn_again(run, [same])
            kept = [_warn_unit(WorkUnit(k, k), [same]) for k in ("k1", "k2")]
    assert [str(w.message) for w in shown] == ["a forward pass"]
    assert run.entries == [same]
    assert kept == [[KeptWarning(k, AISafetyWarning, "a forward pass")] for k in ("k1", "k2")]


def test_the_torchscript_one_image_warning_of_a_worker_reaches_the_driver(tmp_path):
    """Raised once per process, where the archive is loaded: on Ray in the worker's
    ``_prepared`` (never in the driver), handed back by the prepare task, also on a later run
    that reuses the loaded model (the warning is not raised again there); the driver then
    prints and keeps it (checked on the test cluster too, tests/test_scale_out.py)."""
    from aisafety.prediction.torchscript import TorchScriptPredictor

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # the constant, as intended
        traced = torch.jit.trace(BatchAsConstant().eval(), torch.rand(1, 1, 28, 28))
    path = tmp_path / "traced.ts"
    torch.jit.save(traced, str(path))
    model = {"source": "torchscript", "path": str(path), "input_shape": [1, 28, 28]}
    plan = plan_from_dict({**FIELDS, "model": model, "attacks": FGSM}, "p")
    url = f"sqlite:///{tmp_path / 'r.db'}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AISafetyWarning)  # the worker's terminal
        first, _ = tasks.prepare(plan, url, str(tmp_path))
        again, _ = tasks.prepare(plan, url, str(tmp_path))  # the worker's next run
    for info in (first, again):
        messages = [w.message for w in info["warnings"]]
        # the file the plan names (session 21; the loader hands the archive over as bytes)
        warned = f"TorchScript archive {str(path)!r} runs on one image but not on two"
        assert any(warned in m for m in messages)
    assert isinstance(tasks._PREPARED[next(iter(tasks._PREPARED))][1].context.predictor,
                      TorchScriptPredictor)  # fmt: skip
