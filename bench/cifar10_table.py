"""docs/cifar10.md's table: examples/cifar10.yaml on each real CIFAR-10 net, one capability
at a time, with each one's value, CPU and wall seconds and peak resident memory.

    python bench/cifar10_table.py --limit 10 --db sqlite:////tmp/cifar10.db [--nets resnet_2b]

The nets are resnet_2b, resnet_4b (VNN-COMP 2021), the ViT pgd_2_3_16 (VNN-COMP 2023) and
the Keras CNN (../shared/data/cifar10-models, README section 6); each takes the ``model:``
block of its file in examples/cifar10-models/. The plan's metrics run as separate runs,
one capability each (the attacks only with robust accuracy), so that each row's cost is its
own: the example itself puts the metrics that have no unit of their own into one "clean
metrics" unit. Each net runs in a fresh process (``--net``), so a peak is not an earlier
net's. A capability the net cannot take (a verifier on a ViT) is refused before any work;
the row prints the refusal. Times and peaks are read back from the store's ``units`` rows
(``aisafety/unit_cost.py``): the run's wall and CPU seconds summed over its units, and the
largest peak resident size (the process's, the loaded model and data included).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "examples" / "cifar10.yaml"
MODELS = ROOT / "examples" / "cifar10-models"
NETS = ("resnet_2b", "resnet_4b", "pgd_2_3_16", "cifar10_keras_cnn")


def capabilities(metrics: list) -> list[tuple[str, list]]:
    """(row name, metrics) per capability of the plan, in its order."""
    rows = []
    for m in metrics:
        name = m if isinstance(m, str) else m["name"]
        verifier = None if isinstance(m, str) else m.get("config", {}).get("verifier")
        rows.append((f"{name} ({verifier})" if verifier else name, [m]))
    return rows


def run_net(
    net: str, limit: int, db: str, skip: list[str], gib: float | None, rows: list[str]
) -> None:
    """Every capability of the plan on ``net``, each a run of its own; prints one line each."""
    import aisafety
    from aisafety.config import resolve_paths
    from aisafety.errors import AISafetyError
    from aisafety.plan_yaml import load_yaml

    plan = resolve_paths(load_yaml(PLAN.read_text()), PLAN.parent)
    model_file = MODELS / f"{net}.yaml"
    model = resolve_paths(load_yaml(model_file.read_text()), model_file.parent)["model"]
    for row, metrics in capabilities(plan["metrics"]):
        name = metrics[0] if isinstance(metrics[0], str) else metrics[0]["name"]
        if name in skip or (rows and row not in rows):
            continue
        one = {
            **plan,
            "model": model,
            "metrics": metrics,
            "dataset": {**plan["dataset"], "limit": limit},
        }
        if gib is not None:  # the budget every capability chunks under (docs/memory.md)
            one["limits"] = {**one.get("limits", {}), "memory_gib": gib}
        if name != "robust-accuracy":
            one.pop("attacks", None)
        if name not in ("mce", "rmce"):
            one.pop("corruptions", None)
        try:
            record = aisafety.evaluate(one, db=db)
        except AISafetyError as exc:
            print(
                f"| {net} | {row} | refused: {str(exc).splitlines()[0][:300]} | | | |", flush=True
            )
            continue
        values = "; ".join(_value(v) for v in record.values)
        print(f"| {net} | {row} | {values} | {_cost(db, record.run_id)} |", flush=True)


def _value(v) -> str:
    """The value, at its l-inf budget in 1/255 (a smoothing radius: l2, as stored)."""
    if v.eps is None:
        at = ""
    elif v.metric.startswith("smoothed"):
        at = f" @ l2 {v.eps:g}"
    else:
        at = f" @ {v.eps * 255:.3g}/255"
    return f"{v.value:.3g}{at}" if v.value is not None else f"nan{at}"


def _cost(db: str, run_id: int) -> str:
    """CPU and wall seconds over the run's units (the order of docs/cifar10.md's columns:
    CPU first, the load-independent one), and their largest peak (MiB)."""
    from sqlalchemy import create_engine, text

    with create_engine(db).connect() as c:
        rows = c.execute(
            text("SELECT seconds, cpu_seconds, peak_rss_mib FROM units WHERE run_id = :r"),
            {"r": run_id},
        ).all()
    wall, cpu = sum(r[0] or 0 for r in rows), sum(r[1] or 0 for r in rows)
    peaks = [r[2] for r in rows if r[2] is not None]
    return f"{cpu:.1f} | {wall:.1f} | {max(peaks):.0f}" if peaks else f"{cpu:.1f} | {wall:.1f} | -"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=10, help="images per net")
    parser.add_argument("--db", default="sqlite:///cifar10.db")
    parser.add_argument("--nets", nargs="*", default=list(NETS), choices=NETS)
    parser.add_argument("--skip", nargs="*", default=[], help="metric names to leave out")
    parser.add_argument("--memory-gib", type=float, help="the plans' limits.memory_gib")
    parser.add_argument(
        "--rows", nargs="*", default=[], help="only these rows, e.g. 'certified-accuracy (crown)'"
    )
    parser.add_argument("--net", choices=NETS, help=argparse.SUPPRESS)  # one net, this process
    args = parser.parse_args()
    if args.net:
        run_net(args.net, args.limit, args.db, args.skip, args.memory_gib, args.rows)
        return
    print("| net | capability | value | CPU s | wall s | peak RSS MiB |\n|---|---|---|---|---|---|")
    for net in args.nets:
        command = [sys.executable, __file__, "--net", net, "--limit", str(args.limit)]
        command += ["--db", args.db, "--skip", *args.skip, "--rows", *args.rows]
        command += [] if args.memory_gib is None else ["--memory-gib", str(args.memory_gib)]
        subprocess.run(command, check=False)


if __name__ == "__main__":
    main()
