"""The SoK's "which verifier when" cells for any verifier: certified / falsified / unknown /
timeout of the SoK's 100 MNIST test images, CPU seconds and peak memory, per model and eps;
each sample's margin and verdict are kept so the proved orderings can be checked sample by
sample (``--check``).

    python bench/sok_verifiers.py --models sok-fcnn-b-adv1 --verifiers recurjac fastlip \\
        [--eps 0.02 0.1 0.3] [--limit 100] [--timeout 60] [--out bench/sok_verifiers.jsonl]
    python bench/sok_verifiers.py --check bench/sok_verifiers.jsonl
    python bench/sok_verifiers.py --table bench/sok_verifiers.jsonl  # the docs' rows

Each model runs in a fresh process with one thread, its verifiers in the order given (the
peak resident size printed after a cell is the process's so far: list cheap verifiers
first, and a rise names the verifier that caused it); 60 CPU seconds per sample
(``clock: cpu``), every sample verified (no PGD-100 first), as the FCNNa table of #34 in
docs/certification.md. A verifier that refuses the model (the SDPs past ``max_size``) is
recorded with its message. Appends one JSON line per cell to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from shared_location import shared_data  # noqa: E402

# (looser, tighter): the orderings the literature proves, checked per sample where both ran
PROVED = [("crown", "lp-full"), ("deepz", "refinezono"), ("lp-full", "k-relu"),
          ("fastlip", "recurjac"), ("op-norm", "fastlip"), ("sdpverify", "lmiverify"),
          ("deeppoly", "lp-full"), ("wk", "lp-full")]  # fmt: skip
SLACK = 1e-4  # LP optima are moved outwards by up to 1e-5 (1 + |v|)


def child(model: str, verifiers: list[str], eps: list[float], limit: int, timeout: float) -> None:
    """Every (verifier, eps) of one model; prints one JSON line per cell."""
    import torch

    from aisafety.database.zoo import load_zoo_model
    from aisafety.interfaces import DatasetSpec
    from aisafety.loading import load_data
    from aisafety.plugins import default_registry
    from aisafety.verification.graph import VerificationError, build_graph
    from aisafety.verification.property import robustness_property
    from aisafety.verification.registry import make_verifier

    torch.set_num_threads(1)
    registry = default_registry()
    spec = DatasetSpec(name="mnist", path=shared_data("mnist"), limit=limit, sampling="uniform")
    data = load_data(spec, registry)
    predictor = load_zoo_model(model)
    graph = build_graph(predictor.network.cpu(), predictor.input_shape, model)
    config = {"batch_size": 4, "timeout": timeout, "clock": "cpu"}
    for verifier, radius in ((v, r) for v in verifiers for r in eps):
        cell = {"model": model, "verifier": verifier, "eps": radius, "n": len(data.x)}
        try:
            made = make_verifier(registry, verifier, config)
            made.check(graph)
        except VerificationError as exc:
            print(json.dumps({**cell, "refused": str(exc)}), flush=True)
            continue
        prop = robustness_property(data.x, data.y, radius, predictor.num_classes)
        began = time.process_time()
        result = made.verify(graph, prop, predictor.logits)
        verdicts = [v.value for v in result.verdicts]
        print(json.dumps({
            **cell, "cpu_s": time.process_time() - began,
            "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            **{k: verdicts.count(k) for k in ("certified", "falsified", "unknown", "timeout")},
            "verdicts": verdicts, "margins": [float(m) for m in result.margins],
        }), flush=True)  # fmt: skip


def run(args: argparse.Namespace) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    for model in args.models:
        command = [sys.executable, __file__, "--child", model, *args.verifiers,
                   "--limit", str(args.limit), "--timeout", str(args.timeout),
                   "--eps", *map(str, args.eps)]  # fmt: skip
        with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) as proc:
            for line in proc.stdout:
                if not line.startswith("{"):
                    continue
                with open(args.out, "a") as handle:
                    handle.write(line)
                cell = json.loads(line)
                shown = cell.get("refused") or (
                    f"{cell['certified']} ({cell['falsified']} / {cell['unknown']} / "
                    f"{cell['timeout']}) {cell['cpu_s']:.1f} CPU s, {cell['peak_mib']:.0f} MiB"
                )
                print(model, cell["verifier"], cell["eps"], shown, flush=True)


def check(path: Path) -> int:
    """Per sample, every PROVED pair where both ran, and no certified sample falsified by
    another verifier; prints the violations and returns their count."""
    cells: dict[tuple, dict] = {}
    for line in path.read_text().splitlines():
        cell = json.loads(line)
        if "margins" in cell:
            cells[(cell["model"], cell["eps"], cell["verifier"])] = cell
    bad = checked = 0
    for (model, eps, name), cell in cells.items():
        for looser, tighter in PROVED:
            if name != looser or (model, eps, tighter) not in cells:
                continue
            theirs = cells[(model, eps, tighter)]
            for i, (low, high) in enumerate(zip(cell["margins"], theirs["margins"], strict=True)):
                settled = "timeout" not in (cell["verdicts"][i], theirs["verdicts"][i])
                falsified = "falsified" in (cell["verdicts"][i], theirs["verdicts"][i])
                if settled and not falsified:  # a falsified margin is a point's value
                    checked += 1
                    if low - high > SLACK * (1 + abs(high)):
                        bad += 1
                        print(f"{model} eps {eps} #{i}: {looser} {low:.6g} > {tighter} {high:.6g}")
        for other in cells:
            if other[:2] == (model, eps):
                for i, verdict in enumerate(cell["verdicts"]):
                    checked += 1
                    if verdict == "certified" and cells[other]["verdicts"][i] == "falsified":
                        bad += 1
                        print(f"{model} eps {eps} #{i}: {name} certified, {other[2]} falsified")
    print(f"{checked} per-sample comparisons, {bad} violations")
    return bad


def table(paths: list[Path]) -> None:
    """The cells as the docs' Markdown rows: certified (falsified / unknown / timeout) per
    eps, CPU seconds over the eps, the process's peak MiB after the last."""
    rows: dict[tuple, dict] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            cell = json.loads(line)
            rows.setdefault((cell["model"], cell["verifier"]), {})[cell["eps"]] = cell
    for (model, verifier), cells in rows.items():
        shown, cpu, peak = [], 0.0, 0.0
        for eps in sorted(cells):
            cell = cells[eps]
            if "refused" in cell:
                shown.append("refused")
                continue
            n = cell["n"]
            shown.append(f"{100 * cell['certified'] / n:.0f}% ({cell['falsified']} / "
                         f"{cell['unknown']} / {cell['timeout']})")  # fmt: skip
            cpu, peak = cpu + cell["cpu_s"], max(peak, cell["peak_mib"])
        print(f"| {model} | {verifier} | {' | '.join(shown)} | {cpu:.1f} | {peak:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs="+", metavar="MODEL VERIFIER")
    parser.add_argument("--models", nargs="+", default=[])
    parser.add_argument("--verifiers", nargs="+", default=[])
    parser.add_argument("--eps", nargs="+", type=float, default=[0.02, 0.1, 0.3])
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=Path("bench/sok_verifiers.jsonl"))
    parser.add_argument("--check", type=Path)
    parser.add_argument("--table", nargs="+", type=Path)
    args = parser.parse_args()
    if args.table:
        table(args.table)
        return
    if args.check:
        sys.exit(1 if check(args.check) else 0)
    if args.child:
        child(args.child[0], args.child[1:], args.eps, args.limit, args.timeout)
    else:
        run(args)


if __name__ == "__main__":
    main()
