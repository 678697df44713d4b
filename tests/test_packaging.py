"""The package ships what its default run needs, installed editable or not."""

from __future__ import annotations

import os
import shutil
import sys
import tomllib
from pathlib import Path

import children

ROOT = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed_in_pyproject():
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "aisafety").rglob("__init__.py")
    }
    assert found - listed == set(), "add these packages to [tool.setuptools] packages"


def _source_copy(folder: Path) -> Path:
    """What pyproject.toml builds from, in ``folder``: setuptools writes ``build/`` and
    ``aisafety.egg-info`` beside the source it builds, which must not be the checkout."""
    folder.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, folder / name)
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "data")  # aisafety/data: a link
    for name in ("aisafety", "database"):
        shutil.copytree(ROOT / name, folder / name, ignore=skip)
    return folder


def _build_outputs() -> set[str]:
    return {p.name for p in ROOT.iterdir() if p.name == "build" or p.name.endswith(".egg-info")}


def test_non_editable_install_runs_the_default_data_and_model(tmp_path):
    from legacy_layouts import build

    build(f"sqlite:///{tmp_path / 'old.db'}", "2a40541")  # upgraded by the shipped migrations
    target = tmp_path / "site"
    built_here = _build_outputs()
    children.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(_source_copy(tmp_path / "source"))],
        check=True, capture_output=True,
    )  # fmt: skip
    assert _build_outputs() == built_here, "the install wrote build outputs into the checkout"
    script = (
        "import aisafety, sys;"
        "from aisafety.database.zoo import load_zoo_model;"
        "from aisafety.database.datasets.embedded import EmbeddedCifar10, EmbeddedMnist;"
        "assert EmbeddedCifar10().load(None, 'test').x.shape == (100, 3, 32, 32);"
        "p = load_zoo_model('mnist-cnn'); d = EmbeddedMnist().load(None, 'test');"
        "acc = (p.predict(d.x) == d.y).float().mean().item();"
        "from aisafety.store.results import ResultStore;"
        "s = ResultStore('sqlite:///old.db');"
        "from aisafety.store.migrations import HEAD;"
        "assert s.query('SELECT version_num FROM alembic_version')[1] == [(HEAD,)];"
        "n = 'SELECT COUNT(*) - COUNT(broken_by) FROM sample_outcomes';"
        "assert s.query(n)[1] == [(5,)];"
        "print(aisafety.__file__, acc)"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = children.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    location, accuracy = out.stdout.split()
    assert location.startswith(str(target))
    assert float(accuracy) > 0.97
