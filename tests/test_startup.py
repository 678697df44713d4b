"""Fast start: the command line imports nothing heavy until a command needs it, and
`aisafety list` answers from a cache that any change of code, plugins or zoo invalidates.
(Times are measured by bench/startup.py, not asserted here.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import children
import pytest

from aisafety import cli, listing, listing_cache

HEAVY = ("torch", "sqlalchemy", "pydantic", "scipy", "numpy", "aisafety.plugins")


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return children.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env})  # fmt: skip


def _live(kind: str, monkeypatch, capsys, **env: str) -> object:
    """``aisafety list KIND --format json``'s live answer, computed in this process (which
    lists live, tests/conftest.py): the reference the cached and shipped answers are held
    to. A process of its own imported torch and every plugin again (2-3 s) for a value
    whose process is not what the test is about."""
    monkeypatch.setenv("AISAFETY_LIST_CACHE", "0")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()
    assert cli.main(["list", kind, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_importing_the_command_line_and_help_load_nothing_heavy():
    done = _python(
        "import sys, contextlib, io\n"
        "import aisafety.cli\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    aisafety.cli.main(['--help'])\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_cached_listing_loads_no_plugin_and_equals_the_live_one(tmp_path, monkeypatch, capsys):
    # an extra (empty) zoo: the built-ins' shipped listing is then not the whole answer, so
    # the first listing builds the cache as it does wherever a plugin is installed
    zoo = tmp_path / "zoo"
    zoo.mkdir()
    env = {"AISAFETY_CACHE_DIR": str(tmp_path), "AISAFETY_LIST_CACHE": "1",
           "AISAFETY_ZOO_PATH": str(zoo)}  # fmt: skip
    code = (
        "import sys\n"
        "from aisafety.cli import main\n"
        "main(['list', 'attacks', '--format', 'json'])\n"
        f"print('LOADED', [m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr)"
    )
    first, second = _python(code, **env), _python(code, **env)
    live = _live("attacks", monkeypatch, capsys, AISAFETY_ZOO_PATH=str(zoo))
    assert first.returncode == second.returncode == 0, first.stderr
    assert "'torch'" in first.stderr  # built the listing: every plugin imported
    assert "LOADED []" in second.stderr  # answered from the cache
    assert json.loads(second.stdout) == json.loads(first.stdout) == live
    assert len(list(tmp_path.glob("list-attacks-*.json"))) == 1
    # the first listing cached every plugin kind: a first `list metrics` imports nothing heavy
    for kind in listing.LIST_KINDS:
        assert len(list(tmp_path.glob(f"list-{kind}-*.json"))) == 1, kind
    metrics = _python(code.replace("'attacks'", "'metrics'"), **env)
    assert metrics.returncode == 0 and "LOADED []" in metrics.stderr, metrics.stderr


def test_a_first_listing_of_the_builtins_loads_nothing_heavy(tmp_path, monkeypatch, capsys):
    """No cache yet (the first call after an install): the shipped listing answers, as the
    live one would, without importing torch (issue #36: 9-12 s before)."""
    code = (
        "import sys\n"
        "from aisafety.cli import main\n"
        "main(['list', 'verifiers', '--format', 'json'])\n"
        f"print('LOADED', [m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr)"
    )
    env = {"AISAFETY_CACHE_DIR": str(tmp_path), "AISAFETY_LIST_CACHE": "1"}
    if not listing_cache.only_builtins():
        pytest.skip("a plugin or an extra zoo is installed: the shipped listing does not apply")
    first = _python(code, **env)
    assert first.returncode == 0, first.stderr
    assert "LOADED []" in first.stderr
    assert json.loads(first.stdout) == _live("verifiers", monkeypatch, capsys)


@pytest.mark.parametrize("kind", [*listing.LIST_KINDS, "models"])
def test_the_shipped_listing_is_the_live_one(kind, monkeypatch):
    monkeypatch.setenv("AISAFETY_LIST_CACHE", "1")
    if not listing_cache.only_builtins():
        pytest.skip("a plugin or an extra zoo is installed: the shipped listing does not apply")
    from aisafety.cli.common import default_registry

    live, complete = listing.list_entries(kind, default_registry())
    assert complete
    assert listing_cache.shipped(kind) == live, (
        f"aisafety/builtin_listing.json is out of date for {kind!r}: regenerate it with "
        'python -c "from aisafety.listing import write_shipped_listing as w; w()"'
    )


def test_the_key_follows_code_and_zoo_manifests(tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(listing_cache, "PACKAGE", package)
    monkeypatch.delenv("AISAFETY_ZOO_PATH", raising=False)
    before = listing_cache.key("attacks")
    assert listing_cache.key("attacks") == before and listing_cache.key("metrics") != before
    (package / "a.py").write_text("x = 22\n")  # an edited source file (size and time differ)
    edited = listing_cache.key("attacks")
    assert edited != before
    zoo = tmp_path / "zoo"
    zoo.mkdir()
    monkeypatch.setenv("AISAFETY_ZOO_PATH", str(zoo))
    with_zoo = listing_cache.key("models")
    (zoo / "manifest.json").write_text("{}")
    assert listing_cache.key("models") != with_zoo


@pytest.mark.parametrize("complete", [True, False])
def test_only_a_listing_without_plugin_failures_is_cached(tmp_path, monkeypatch, capsys, complete):
    monkeypatch.setenv("AISAFETY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(listing_cache, "SHIPPED", tmp_path / "none.json")
    monkeypatch.setenv("AISAFETY_LIST_CACHE", "1")
    entries = [{"name": "my-attack", "config": {"steps": 10, "rho": 0.75}}]
    monkeypatch.setattr(listing, "list_entries", lambda kind, registry: (entries, complete))
    assert cli.main(["list", "attacks"]) == 0
    assert "steps=10, rho=0.75" in capsys.readouterr().out  # settings shown in the table
    monkeypatch.setattr(listing, "list_entries", lambda kind, registry: ([{"name": "live"}], True))
    assert cli.main(["list", "attacks", "--format", "json"]) == 0
    names = [e["name"] for e in json.loads(capsys.readouterr().out)]
    assert names == (["my-attack"] if complete else ["live"])


def test_list_shows_every_attacks_and_metrics_settings(monkeypatch, capsys):
    assert cli.main(["list", "attacks", "--format", "json"]) == 0
    attacks = {e["name"]: e for e in json.loads(capsys.readouterr().out)}
    expected = {"seed": 0, "chunk_size": None, "steps": 40, "step_size": None,
                "random_start": True, "early_stop": False}  # fmt: skip
    assert expected.items() <= attacks["pgd-linf"]["config"].items()
    assert attacks["square-linf"]["config"]["queries"] > 0
    assert cli.main(["list", "metrics", "--format", "json"]) == 0
    metrics = {e["name"]: e for e in json.loads(capsys.readouterr().out)}
    assert metrics["ald"]["config"] == {"p": "2"}
    assert all("config" in e for e in metrics.values())
