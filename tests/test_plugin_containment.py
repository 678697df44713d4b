"""A plugin that calls sys.exit at import, or whose hook returns junk, disables itself,
not the command (issue #35, finding 6; aisafety/plugins.py); a run stores that it ran
without it (a ``PluginLoadWarning`` in ``run_warnings``)."""

from __future__ import annotations

import sys
import types
import warnings
from importlib import metadata

import pytest

import aisafety
from aisafety.cli import main
from aisafety.config import plan_from_dict
from aisafety.errors import PluginLoadWarning
from aisafety.hookspecs import PROJECT, hookimpl
from aisafety.plugins import build_registry
from aisafety.report_page import build_report
from aisafety.store.results import ResultStore
from aisafety.warning_log import KeptWarning


@pytest.fixture
def exiting_entry_point(tmp_path, monkeypatch):
    """An installed-looking plugin whose module calls sys.exit(3) when imported."""
    (tmp_path / "exits_at_import.py").write_text("import sys\nsys.exit(3)\n")
    # not monkeypatch.syspath_prepend: with a pkg_resources namespace left in sys.modules by
    # another package (setuptools without pkg_resources), it fails importing a pkg_resources API
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    point = metadata.EntryPoint("exits-at-import", "exits_at_import", PROJECT)
    real = metadata.entry_points

    def entry_points(**selection):
        found = list(real(**selection))
        return [*found, point] if selection.get("group") == PROJECT else found

    monkeypatch.setattr(metadata, "entry_points", entry_points)


def test_system_exit_at_import_is_contained(exiting_entry_point, monkeypatch, capsys):
    registry = build_registry()
    (failure,) = [f for f in registry.failures if f.name == "exits-at-import"]
    assert "SystemExit: 3" in failure.error
    assert "fgsm" in registry.names("attack")  # the built-ins and other plugins still load
    monkeypatch.setattr("aisafety.cli.common.default_registry", lambda: registry)
    assert main(["plugins"]) == 1
    assert "'exits-at-import'" in capsys.readouterr().out
    assert main(["list", "attacks", "--format", "json"]) == 0


def _plugin(**hooks) -> types.ModuleType:
    module = types.ModuleType("junk")
    for name, function in hooks.items():
        setattr(module, name, hookimpl(function))
    return module


@pytest.mark.parametrize(
    "returned, named",
    [([42, "not-a-class"], "returned 42 among its attacks"), (42, "returned 42;"),
     ("fgsm", "returned 'fgsm';")],
)  # fmt: skip
def test_a_hook_returning_junk_disables_that_plugin_only(returned, named, tmp_path, monkeypatch,
                                                         capsys):  # fmt: skip
    module = _plugin(aisafety_attacks=lambda: returned, aisafety_metrics=lambda: [])
    registry = build_registry(extra_plugins=[("junk", module)])
    (failure,) = registry.failures
    assert failure.name == "junk" and named in failure.error
    assert "junk" not in {p.name for p in registry.plugins}
    monkeypatch.setattr("aisafety.cli.common.default_registry", lambda: registry)
    plan = tmp_path / "p.yaml"
    plan.write_text("metrics: [ca]\ndevice: cpu\n")
    assert main(["evaluate", str(plan), "--db", f"sqlite:///{tmp_path / 'r.db'}",
                 "--limit", "10", "--quiet"]) == 0  # fmt: skip
    assert "warning: plugin 'junk'" in capsys.readouterr().err


def test_a_nameless_class_is_skipped_and_named_while_the_command_runs(tmp_path, monkeypatch,
                                                                     capsys):  # fmt: skip
    """A class (not junk) without a name is skipped by the registry and named as a failure
    of its plugin (tests/test_hooks.py checks the same per hook); nothing of it registers."""
    module = _plugin(
        aisafety_attacks=lambda: [type("Nameless", (), {})], aisafety_metrics=lambda: []
    )
    registry = build_registry(extra_plugins=[("junk", module)])
    (failure,) = registry.failures
    assert failure.name == "junk" and "Nameless" in failure.error
    assert not [name for name, source in registry.sources["attack"].items() if source == "junk"]
    monkeypatch.setattr("aisafety.cli.common.default_registry", lambda: registry)
    plan = tmp_path / "p.yaml"
    plan.write_text("metrics: [ca]\ndevice: cpu\n")
    assert main(["evaluate", str(plan), "--db", f"sqlite:///{tmp_path / 'r.db'}",
                 "--limit", "10", "--quiet"]) == 0  # fmt: skip
    assert "warning: plugin 'junk'" in capsys.readouterr().err


def test_system_exit_in_a_hook_is_contained():
    def leave():
        raise SystemExit(1)

    registry = build_registry(extra_plugins=[("leaves", _plugin(aisafety_attacks=leave))])
    assert [f.name for f in registry.failures] == ["leaves"]
    assert "fgsm" in registry.names("attack")


def test_keyboard_interrupt_in_a_hook_still_interrupts():
    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_registry(extra_plugins=[("ctrl-c", _plugin(aisafety_attacks=interrupted))])


EXITS = "plugin 'exits-at-import' (exits_at_import): SystemExit: 3 (details: aisafety plugins)"


def _stored(url: str) -> list[tuple]:
    return ResultStore(url).query("SELECT unit_key, category, message FROM run_warnings")[1]


def test_a_plugin_that_failed_to_load_is_stored_with_the_run(exiting_entry_point, tmp_path,
                                                            monkeypatch):  # fmt: skip
    """A user reading the run later (SQL, ``aisafety report``) learns that it ran without
    the plugin: before, only a command-line line said so, and ``aisafety.evaluate`` nothing."""
    monkeypatch.setattr("aisafety.runner.default_registry", build_registry)  # reads the fake
    url = f"sqlite:///{tmp_path / 'r.db'}"
    plan = {"device": "cpu", "metrics": ["ca"], "dataset": {"limit": 8}}
    with pytest.warns(PluginLoadWarning) as shown:
        record = aisafety.evaluate(plan, db=url)
    assert [str(w.message) for w in shown if w.category is PluginLoadWarning] == [EXITS]
    assert [v.metric for v in record.values] == ["ca"]  # the run went on without it
    assert _stored(url) == [(None, "PluginLoadWarning", EXITS)]  # the run's own
    html = build_report(ResultStore(url), record.run_id)
    assert '<section id="warnings"' in html
    assert "plugin &#39;exits-at-import&#39; (exits_at_import): SystemExit: 3" in html


def test_evaluate_prints_a_failed_plugin_once_and_stores_it(exiting_entry_point, tmp_path,
                                                           monkeypatch, capsys):  # fmt: skip
    registry = build_registry()
    monkeypatch.setattr("aisafety.cli.common.default_registry", lambda: registry)
    monkeypatch.setattr("aisafety.runner.default_registry", lambda: registry)
    plan = tmp_path / "p.yaml"
    plan.write_text("metrics: [ca]\ndevice: cpu\nseeds: [0, 1]\n")
    url = f"sqlite:///{tmp_path / 'r.db'}"
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        assert main(["evaluate", str(plan), "--db", url, "--limit", "8", "--quiet"]) == 0
    assert capsys.readouterr().err.count("warning: plugin 'exits-at-import'") == 1
    assert not [w for w in shown if w.category is PluginLoadWarning]  # not again per run
    assert _stored(url) == [(None, "PluginLoadWarning", EXITS)] * 2  # each seed's run


def test_a_ray_worker_hands_a_failed_plugin_to_the_driver(exiting_entry_point, tmp_path,
                                                         monkeypatch):  # fmt: skip
    """The prepare task returns it with the run's other warnings (the driver stores the
    ones it did not raise itself: a plugin broken on the worker only)."""
    from aisafety.distributed.tasks import prepare
    from aisafety.store.interruption import HANG_ENDS_PROCESS

    monkeypatch.setattr("aisafety.runner.default_registry", build_registry)
    monkeypatch.setenv(HANG_ENDS_PROCESS, "")  # prepare sets it for the worker's process
    monkeypatch.chdir(tmp_path)  # and moves to the plan's folder
    plan = plan_from_dict({"device": "cpu", "metrics": ["ca"], "dataset": {"limit": 8}}, "p")
    with pytest.warns(PluginLoadWarning):
        info, _ = prepare(plan, f"sqlite:///{tmp_path / 'r.db'}", str(tmp_path))
    assert [w for w in info["warnings"] if w.category is PluginLoadWarning] == [
        KeptWarning(None, PluginLoadWarning, EXITS)
    ]
