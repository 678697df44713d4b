"""docs/metrics.md's index names every built-in metric, its kind and its file, and each
family file's docstring names the metrics it registers: a newcomer finds a metric by name."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from aisafety.evaluation.base import AttackMetric, CleanMetric
from aisafety.evaluation.metrics.neuron_base import NeuronDataMetric
from aisafety.plugins import BUILTIN, build_registry

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\| `([^`]+)` \| ([^|]+) \| `([^`]+)` \|$")


def documented() -> dict[str, tuple[str, str]]:
    text = (ROOT / "docs" / "metrics.md").read_text()
    section = text.split("## Where each metric lives", 1)[1].split("\n## ", 1)[0]
    return {m[1]: (m[2].strip(), m[3]) for line in section.splitlines() if (m := ROW.match(line))}


def registered() -> dict[str, tuple[str, str]]:
    registry = build_registry()
    out = {}
    for name in registry.names("metric"):
        if registry.sources["metric"][name] != BUILTIN:
            continue  # third-party metrics document themselves
        cls = registry.get("metric", name)
        if issubclass(cls, NeuronDataMetric):
            kind = "attack or clean (`data`)"
        elif issubclass(cls, AttackMetric):
            kind = "attack"
        else:
            assert issubclass(cls, CleanMetric), f"{name}: neither a clean nor an attack metric"
            kind = "clean"
        out[name] = (kind, cls.__module__.replace(".", "/") + ".py")
    return out


def test_index_matches_the_registry():
    assert documented() == registered()


def test_every_indexed_file_exists_and_names_its_metrics():
    for _, path in registered().values():
        assert (ROOT / path).is_file(), path
    registry = build_registry()
    for name in registered():
        doc = sys.modules[registry.get("metric", name).__module__].__doc__ or ""
        assert f"``{name}``" in doc, f"{name!r} is not named in its module's docstring"
