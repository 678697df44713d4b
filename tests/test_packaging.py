"""The package ships what its default run needs, installed editable or not."""

from __future__ import annotations

import os
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


def test_non_editable_install_runs_the_default_data_and_model(tmp_path):
    from legacy_layouts import build

    build(f"sqlite:///{tmp_path / 'old.db'}", "2a40541")  # upgraded by the shipped migrations
    target = tmp_path / "site"
    children.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(ROOT)],
        check=True, capture_output=True,
    )  # fmt: skip
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
