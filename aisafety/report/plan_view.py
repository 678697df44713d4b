"""The plan as its author wrote it: the stored plan (every field, defaults included) with the
fields that hold their default value folded away, so the report does not show a
``corruptions`` block for a run without corruptions."""

from __future__ import annotations

from typing import Any

from aisafety.interfaces import AttackSpec, DefenseSpec, EvaluationPlan, MetricSpec

# the spec of each list's items: an item's field at its default is folded like a top-level one
ITEMS = {"attacks": AttackSpec, "metrics": MetricSpec, "defenses": DefenseSpec}
# what a reader needs even at its default: which model, which data, which budgets
KEPT = {"model": ("name",), "dataset": ("name",), "attacks": ("name", "eps")}


def fold_defaults(plan: dict[str, Any]) -> dict[str, Any]:
    """``plan`` without the fields equal to ``EvaluationPlan()``'s (recursively in mappings;
    list items against their spec's defaults), except the model's and dataset's names and
    each attack's name and budgets."""
    folded = _fold(plan, EvaluationPlan().model_dump(mode="json"))
    for section in ("model", "dataset"):
        if isinstance(plan.get(section), dict):
            kept = {k: plan[section][k] for k in KEPT[section] if k in plan[section]}
            folded[section] = {**kept, **folded.get(section, {})}
    return {key: folded[key] for key in plan if key in folded}


def _fold(value: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
    folded = {}
    for key, item in value.items():
        if key in ITEMS and isinstance(item, list):
            item = [_item(entry, ITEMS[key]) for entry in item]
        elif isinstance(item, dict) and isinstance(default.get(key), dict):
            item = _fold(item, default[key])
            if not item:
                continue
        if key in default and item == default[key]:
            continue
        folded[key] = item
    return folded


def _item(entry: Any, spec: type) -> Any:
    if not isinstance(entry, dict) or "name" not in entry:
        return entry
    try:
        default = spec(name=entry["name"]).model_dump(mode="json")
    except Exception:  # an entry this version cannot build: shown as stored
        return entry
    folded = _fold(entry, default)
    kept = KEPT["attacks"] if spec is AttackSpec else ("name",)
    return {k: v for k, v in entry.items() if k in kept or k in folded}
