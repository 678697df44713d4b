"""alpha-CROWN's slope search in float32 against the same search in float64.

    python bench/alpha_crown_search.py [--model sok-cnn-a-adv1] [--eps 0.1] [--rounds 3]
                                       [--images 2] [--steps 20] [--threads 1]
                                       [--data-dir ../shared/data/mnist]

The search's result is always bounded again in float64 (bounds.optimised_backward), so
float32 changes its speed and, by float32 noise, its tightness. Each round bounds the
same ``--images`` uniformly sampled MNIST test images (the SoK plan's sample) both ways, in
alternating order; printed: CPU seconds of each, the paired median ratio, and the largest
difference of the final spec bounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from aisafety.database.zoo import load_zoo_model
from aisafety.interfaces import DatasetSpec
from aisafety.loading import load_data
from aisafety.plugins import default_registry
from aisafety.verification import bounds as b
from aisafety.verification.graph import build_graph
from aisafety.verification.property import robustness_property

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from shared_location import shared_data  # noqa: E402


def alpha_crown(graph, prop, steps: int, dtype: torch.dtype) -> tuple[torch.Tensor, float]:
    """alpha-CROWN's bound (boxes and spec) with the slope search in ``dtype``; CPU s."""
    b.SEARCH_DTYPE = dtype
    began = time.process_time()
    boxes = b.linear_boxes(graph, prop.lower, prop.upper, "adaptive", steps)
    bound, _ = b.optimise_slopes(graph, boxes, prop.spec, steps)
    return bound, time.process_time() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="sok-cnn-a-adv1")
    parser.add_argument("--eps", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data-dir", type=Path, help="default: shared/data/mnist")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data_dir = args.data_dir or shared_data("mnist")
    spec = DatasetSpec(name="mnist", path=str(data_dir), limit=100, sampling="uniform")
    data = load_data(spec, default_registry())
    predictor = load_zoo_model(args.model)
    graph = build_graph(predictor.network.cpu(), predictor.input_shape, args.model)
    ratios, worst = [], 0.0
    for r in range(args.rounds):
        rows = slice(r * args.images, (r + 1) * args.images)
        prop = robustness_property(data.x[rows], data.y[rows], args.eps, 10)
        order = (torch.float32, torch.float64) if r % 2 == 0 else (torch.float64, torch.float32)
        found = {dtype: alpha_crown(graph, prop, args.steps, dtype) for dtype in order}
        (fast, fast_s), (exact, exact_s) = found[torch.float32], found[torch.float64]
        ratios.append(fast_s / exact_s)
        worst = max(worst, float((fast - exact).abs().max()))
        print(f"round {r}: float32 search {fast_s:.1f} s, float64 search {exact_s:.1f} s of CPU")
    print(f"{args.model} eps {args.eps}, {args.images} images per round, {args.steps} steps:")
    print(f"  float32 / float64 search time, paired median: {statistics.median(ratios):.3f}")
    print(f"  largest |bound difference|: {worst:.2e} (both bounded in float64)")


if __name__ == "__main__":
    main()
