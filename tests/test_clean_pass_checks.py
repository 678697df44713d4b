"""A local run and a Ray worker's prepare task make the same checks of the model, in the
same order (``evaluation/clean_pass_checks.py``): a check added to its lists runs on both.
The prepare task runs here in process (tasks.py imports no Ray)."""

from __future__ import annotations

import pytest

from aisafety.config import plan_from_dict
from aisafety.distributed import tasks
from aisafety.evaluation import clean_pass_checks
from aisafety.evaluation.integrity import RunIntegrity
from aisafety.runner import Runner
from aisafety.store.interruption import HANG_ENDS_PROCESS
from aisafety.store.results import ResultStore

LISTS = ("BEFORE_WORK", "WITH_FORWARD_PASSES", "ON_CLEAN_OUTPUTS")


@pytest.fixture
def calls(monkeypatch) -> list[tuple[str, bool]]:
    """Each check of the three lists as it is called: its name and whether the clean pass
    had run; the local runner's integrity check of the clean pass as ``integrity``."""
    made: list[tuple[str, bool]] = []

    def spied(check):
        def spy(ctx) -> None:
            made.append((check.__name__, "clean_logits" in vars(ctx)))
            check(ctx)

        return spy

    for name in LISTS:
        checks = getattr(clean_pass_checks, name)
        monkeypatch.setattr(clean_pass_checks, name, tuple(spied(c) for c in checks))
    check = RunIntegrity.check

    def integrity(self, who: str) -> None:
        if "clean forward pass" in who:
            made.append(("integrity", True))
        check(self, who)

    monkeypatch.setattr(RunIntegrity, "check", integrity)
    monkeypatch.setenv(HANG_ENDS_PROCESS, "")  # prepare sets it for the worker's process
    return made


def test_a_local_run_and_the_ray_prepare_task_check_alike(tmp_path, calls, monkeypatch):
    monkeypatch.chdir(tmp_path)  # prepare moves to the plan's folder
    plan = plan_from_dict({"device": "cpu", "metrics": ["ca"], "dataset": {"limit": 8}}, "p")
    Runner(plan, ResultStore(f"sqlite:///{tmp_path / 'local.db'}"), quiet=True).run()
    local = list(calls)
    calls.clear()
    tasks.prepare(plan, f"sqlite:///{tmp_path / 'ray.db'}", str(tmp_path))
    four = [
        ("warn_if_classes_differ", False),  # before any forward pass
        ("warn_if_not_repeatable", True),
        ("warn_if_at_chance", True),
        ("warn_if_probabilities", True),
    ]
    assert calls == four
    assert local == [*four[:2], ("integrity", True), *four[2:]]  # the passes checked first
