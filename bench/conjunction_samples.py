"""The margins of the Marabou CIFAR rows against their objective sampled in the box.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python3 bench/conjunction_samples.py ROWS.jsonl [N]

A row's margin on these targeted conjunctions is a proved lower bound of min over the box
of max over the nine atoms (``vnncomp._verify_conjunctions``), so it must lie below that
objective at every point: here the centre and N (default 2,000) uniform points and N random
corners, replayed through onnxruntime. Prints per row (finite margins, Marabou nets only)
the margin, the least sampled value and ``ok`` or ``VIOLATED``; exits 1 on a violation.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from aisafety.verification.vnncomp import load_network, value_at
from aisafety.verification.vnnlib import read_disjuncts

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from shared_location import shared_data  # noqa: E402


def least_sampled(net_name: str, spec_name: str, n: int) -> float:
    """The least objective value over the centre, ``n`` uniform points and ``n`` corners."""
    marabou = shared_data("cifar10-models") / "vnncomp2021_marabou_cifar10"
    net = load_network(str(marabou / f"{net_name}.onnx"))
    spec = next(marabou.rglob(spec_name))
    box, disjuncts = read_disjuncts(spec, math.prod(net.shape), net.reference.num_classes)
    lower, upper = (b.reshape(1, *net.shape).double() for b in box)
    draws = torch.rand(2 * n, *net.shape, dtype=torch.float64)
    draws[n:] = draws[n:].round()  # corners
    points = torch.cat([(lower + upper) / 2, lower + (upper - lower) * draws])
    return min(value_at(net, lower, upper, disjuncts, x[None]) for x in points)


def main(rows_path: str, n: int = 2000) -> int:
    torch.manual_seed(0)
    violated = 0
    for line in Path(rows_path).read_text().splitlines():
        row = json.loads(line)
        if "resnet" in row["net"] or not math.isfinite(row["margin"]):
            continue
        least = least_sampled(row["net"], row["property"], n)
        verdict = "ok" if row["margin"] <= least else "VIOLATED"
        violated += verdict != "ok"
        head = f"{row['net']:<15} {row['property']:<62} {row['status']:<8}"
        print(f"{head} margin {row['margin']:9.4f}  least of {2 * n + 1} {least:8.4f}  {verdict}")
    return int(violated > 0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", help="a bench/results/cifar_300s_*.jsonl file")
    parser.add_argument("n", type=int, nargs="?", default=2000, help="uniform points and corners")
    args = parser.parse_args()
    sys.exit(main(args.rows, args.n))
