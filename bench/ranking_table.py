"""The ranking study's tables (docs/metrics.md) from the database ``aisafety compare`` wrote.

    aisafety compare examples/ranking-mnist.yaml --models ... --db sqlite:///ranking.db
    python bench/ranking_table.py ranking.db [--baseline mnist-cnn] [--exclude MODEL ...]

Prints markdown: one row per model (CA, PGD-40 robust accuracy at 0.1/0.2/0.3, APGD-CE and
APGD-DLR at 0.3, their per-sample worst case with PGD-40 at 0.3 from ``sample_outcomes``,
RDI, ROBY, AH mean and std), the Spearman and Kendall correlations of every metric with every
robust accuracy across the models, and AH's rank-sum test of each model against the baseline.
``--exclude`` keeps a model's row in the table (marked †) but leaves it out of the
correlations: for a model whose gradient the plan's attacks cannot use (thermometer encoding),
whose robust accuracy and AH would enter the correlations as if they were sound.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from collections import defaultdict

from scipy import stats

ACCURACY = {
    "PGD-40 0.1": ("pgd-linf(early_stop=True,steps=40)", 0.1),
    "PGD-40 0.2": ("pgd-linf(early_stop=True,steps=40)", 0.2),
    "PGD-40 0.3": ("pgd-linf(early_stop=True,steps=40)", 0.3),
    "APGD-CE 0.3": ("apgd-ce(early_stop=True,steps=100)", 0.3),
    "APGD-DLR 0.3": ("apgd-dlr(early_stop=True,steps=100)", 0.3),
}
WORST = "worst 0.3"
AH = "adversarial-hypervolume"
# the study's AH is the probability-margin search (``loss: prob``): labelled so since the
# default became the logit search; the first runs, made while prob was the default, stored
# the bare name. A model with both keeps the explicit label.
AH_LABELS = ("adversarial-hypervolume(loss=prob)", AH)


def load(db: str):
    con = sqlite3.connect(db)
    values: dict[str, dict[str, float]] = defaultdict(dict)
    per_sample: dict[str, list[float]] = {}
    std: dict[str, float] = {}
    prob_first: dict[str, str] = {}  # which AH label a model's value came from
    for model, metric, attack, eps, value, details in con.execute(
        "SELECT m.name, v.metric, v.attack, v.eps, v.value, v.details FROM metric_values v "
        "JOIN models m ON m.id = v.model_id"
    ):
        if metric == "robust-accuracy":
            for column, key in ACCURACY.items():
                if key == (attack, eps):
                    values[model][column] = value
        elif metric in ("ca", "rdi", "roby"):
            values[model][metric] = value
        elif metric in AH_LABELS and prob_first.get(model) != AH_LABELS[0]:
            prob_first[model] = metric
            values[model][AH] = value
            d = json.loads(details)
            per_sample[model], std[model] = d["per_sample"], d["std"]
    robust = defaultdict(lambda: defaultdict(lambda: True))
    for model, sample, success in con.execute(
        "SELECT m.name, s.sample_index, s.success FROM sample_outcomes s "
        "JOIN attack_runs a ON a.id = s.attack_run_id JOIN models m ON m.id = a.model_id "
        "WHERE a.eps = 0.3"
    ):
        robust[model][sample] &= not success
    for model, samples in robust.items():
        values[model][WORST] = sum(samples.values()) / len(samples)
    return values, per_sample, std


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("db")
    parser.add_argument("--baseline", default="mnist-cnn")
    parser.add_argument("--exclude", nargs="*", default=[], help="rows left out of correlations")
    args = parser.parse_args()
    values, per_sample, std = load(args.db)
    unknown = sorted(set(args.exclude) - set(values))
    if unknown:
        parser.error(f"--exclude {unknown}: not in {args.db}; its models are {sorted(values)}")
    columns = ["ca", *ACCURACY, WORST, "rdi", "roby", AH]
    incomplete = sorted(m for m in values if any(c not in values[m] for c in columns))
    if incomplete:  # a run still going or stopped: its row would mix measured and missing
        print(f"left out, not every column measured yet: {', '.join(incomplete)}\n")
    models = sorted((m for m in values if m not in incomplete), key=lambda m: values[m][WORST])
    ranked = [m for m in models if m not in args.exclude]
    print("| model | " + " | ".join(columns) + " | AH std |")
    print("|---" * (len(columns) + 2) + "|")
    for m in models:
        cells = [f"{values[m].get(c, float('nan')):.3f}" for c in columns]
        mark = " †" if m in args.exclude else ""
        print(f"| `{m}`{mark} | " + " | ".join(cells) + f" | {std.get(m, float('nan')):.3f} |")
    print(f"\n{len(ranked)} models († left out). Rank correlation with each robust accuracy")
    print("(Spearman / Kendall; * Kendall p < 0.05)")
    targets = [*ACCURACY, WORST]
    print("| metric | " + " | ".join(targets) + " |")
    print("|---" * (len(targets) + 1) + "|")
    for metric in ["ca", "rdi", "roby", AH, *ACCURACY, WORST]:
        cells = []
        for target in targets:
            common = [m for m in ranked if metric in values[m] and target in values[m]]
            x = [values[m][metric] for m in common]
            y = [values[m][target] for m in common]
            rho = stats.spearmanr(x, y).statistic
            tau, p = stats.kendalltau(x, y)
            cells.append(f"{rho:+.2f} / {tau:+.2f}" + (" *" if p < 0.05 else ""))
        print(f"| {metric} | " + " | ".join(cells) + " |")
    print(f"\nAH rank-sum test against {args.baseline} (per sample)")
    print("| model | AH | baseline AH | z | p |")
    print("|---|---|---|---|---|")
    base = per_sample[args.baseline]
    for m in models:
        if m != args.baseline and m in per_sample:
            z, p = stats.ranksums(per_sample[m], base)
            ah, base_ah = (values[k][AH] for k in (m, args.baseline))
            print(f"| `{m}` | {ah:.3f} | {base_ah:.3f} | {z:+.2f} | {p:.2g} |")


if __name__ == "__main__":
    main()
