"""The command line's collector at start-up (aisafety/cli/collector.py): `aisafety evaluate`
as the whole process holds full collections off while the plugins and the plan load, then
freezes what is alive; ``main`` called from Python leaves its caller's collector alone.
(The CPU it saves is measured by bench/startup.py --collector, not asserted here.)"""

from __future__ import annotations

import gc
import sys

import pytest

from aisafety import cli
from aisafety.cli import collector, common
from aisafety.cli import evaluate as evaluate_command

ARGV = ["evaluate", "--limit", "2", "--quiet"]


def _observed(monkeypatch, whole_process: bool) -> dict[str, object]:
    """The collector's state while the registry loads and when the plan's run begins; the
    run itself is not made (its numbers are not what this is about)."""
    seen: dict[str, object] = {}
    registry = common.default_registry

    def loading():
        seen["loading"] = gc.get_threshold()
        return registry()

    def run(plan, args):
        seen["running"], seen["frozen"] = gc.get_threshold(), gc.get_freeze_count()
        return 0

    monkeypatch.setattr(common, "default_registry", loading)
    monkeypatch.setattr(evaluate_command, "evaluate_plan", run)
    if gc.get_freeze_count():
        pytest.skip("something in this process froze objects already")
    before = gc.get_threshold()
    try:
        if whole_process:
            monkeypatch.setattr(sys, "argv", ["aisafety", *ARGV])
            assert cli.main() == 0
        else:
            assert cli.main(ARGV) == 0
    finally:
        gc.unfreeze()  # this test process's objects back under the collector
    assert gc.get_threshold() == before
    seen["before"] = before
    return seen


def test_the_console_script_holds_full_collections_while_loading_then_freezes(monkeypatch):
    seen = _observed(monkeypatch, whole_process=True)
    before = seen["before"]
    assert seen["loading"] == (before[0], before[1], collector.HELD)  # young ones go on
    assert seen["running"] == before  # restored before the run begins
    assert seen["frozen"] > 10_000  # torch, the plugins, the plan: skipped from then on


def test_main_called_from_python_leaves_the_collector_alone(monkeypatch):
    seen = _observed(monkeypatch, whole_process=False)
    assert seen["loading"] == seen["running"] == seen["before"]
    assert seen["frozen"] == 0
