"""The command line's collector at start-up (aisafety/cli/collector.py): each command that
loads the plugins (evaluate, compare, check, verify, plugins, list with its cache off), as
the whole process, holds full collections off while they load, then freezes what is alive;
``main`` called from Python leaves its caller's collector alone. (The CPU it saves is
measured by bench/startup.py --collector, not asserted here.)"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest

from aisafety import cli
from aisafety.cli import collector, common

GATE_PLAN = Path(__file__).resolve().parents[1] / "examples" / "ci" / "gate-plan.yaml"
# each command, and what it calls once loaded (its work is not made: not what this is about)
COMMANDS = {
    "evaluate": (["evaluate", "--limit", "2", "--quiet"], "aisafety.cli.evaluate.evaluate_plan"),
    "compare": (["compare", "--models", "mnist-cnn", "mnist-cnn-pgd-at", "--quiet"],
                "aisafety.cli.compare.evaluate_models"),
    "verify": (["verify", "net.onnx", "spec.vnnlib"],
               "aisafety.verification.vnncomp.verify_instance"),
    "list": (["list", "attacks"], "aisafety.listing.list_entries"),
    "plugins": (["plugins"], "aisafety.report.table.render"),
    "check": (["check", str(GATE_PLAN)], "aisafety.check.evaluated_run"),
}  # fmt: skip


class Loaded(Exception):
    """Raised where the command's work would begin: the state is seen, nothing run."""


def _observed(monkeypatch, command: str, whole_process: bool) -> dict[str, object]:
    """The collector's state while the registry loads and when the command's work begins."""
    argv, work = COMMANDS[command]
    seen: dict[str, object] = {}
    registry = common.default_registry

    def loading():
        seen["loading"] = gc.get_threshold()
        return registry()

    def working(*args, **kwargs):
        seen["working"], seen["frozen"] = gc.get_threshold(), gc.get_freeze_count()
        raise Loaded

    monkeypatch.setattr(common, "default_registry", loading)
    monkeypatch.setattr(work, working)
    monkeypatch.setenv("AISAFETY_LIST_CACHE", "0")  # list: every plugin imported
    if gc.get_freeze_count():
        pytest.skip("something in this process froze objects already")
    before = gc.get_threshold()
    try:
        with pytest.raises(Loaded):
            if whole_process:
                monkeypatch.setattr(sys, "argv", ["aisafety", *argv])
                cli.main()
            else:
                cli.main(argv)
    finally:
        gc.unfreeze()  # this test process's objects back under the collector
    assert gc.get_threshold() == before
    seen["before"] = before
    return seen


@pytest.mark.parametrize("command", COMMANDS)
def test_the_console_script_holds_full_collections_while_loading(command, monkeypatch):
    seen = _observed(monkeypatch, command, whole_process=True)
    before = seen["before"]
    assert seen["loading"] == (before[0], before[1], collector.HELD)  # young ones go on
    assert seen["working"] == before  # restored before the work begins
    assert seen["frozen"] > 10_000  # torch, the plugins, the plan: skipped from then on


@pytest.mark.parametrize("command", COMMANDS)
def test_main_called_from_python_leaves_the_collector_alone(command, monkeypatch):
    seen = _observed(monkeypatch, command, whole_process=False)
    assert seen["loading"] == seen["working"] == seen["before"]
    assert seen["frozen"] == 0
