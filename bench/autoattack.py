"""Our `standard` ensemble against torchattacks' AutoAttack(version='standard'), same budget.

Identical settings: torchattacks 3.5.1's AutoAttack runs APGD-CE (10 steps), APGD-T (10
steps, 9 targets), FAB-T (10 steps, 9 targets) and Square (5,000 queries), each on the
samples the earlier ones left; ours runs `standard` with `steps: 10, queries: 5000`. Runs
are interleaved (ours, theirs, ours, ...) and the ratio is the median of the per-pair
ratios, so a machine whose load drifts affects both sides of a pair alike. Robust accuracy
is scored by the network itself on each side's examples projected into the budget.

    python bench/autoattack.py --model mnist-cnn-pgd-at-ft2 --images 200 --pairs 3

Target (issue 16): ours <= 1/3 of torchattacks' time at equal or better robust accuracy.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from aisafety.attack.projection import project
from aisafety.database.datasets.embedded import EmbeddedMnist
from aisafety.database.zoo import load_zoo_model
from aisafety.interfaces import Norm
from aisafety.plugins import default_registry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="mnist-cnn-pgd-at-ft2")
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--eps", type=float, default=0.3)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import torchattacks

    data = EmbeddedMnist().load(None, "test").balanced_subset(args.images, seed=0)
    x, y, eps = data.x, data.y, args.eps
    predictor = load_zoo_model(args.model)
    net = predictor.network.eval()
    ours = default_registry().create("attack", "standard", {"steps": 10, "queries": 5000})

    def run_ours() -> float:
        return ours(predictor, x, y, eps).robust_accuracy

    def run_theirs() -> float:
        attack = torchattacks.AutoAttack(net, norm="Linf", eps=eps, version="standard",
                                         n_classes=10, seed=0)  # fmt: skip
        x_adv = project(attack(x, y), x, eps, Norm.LINF)
        with torch.no_grad():
            return float((net(x_adv).argmax(1) == y).double().mean())

    ratios = []
    print(f"{args.model}, {args.images} images, l-inf {eps}, {args.threads} thread(s)")
    for pair in range(args.pairs):
        times, accuracy = {}, {}
        for side, run in (("ours", run_ours), ("torchattacks", run_theirs)):
            started = time.perf_counter()
            accuracy[side] = run()
            times[side] = time.perf_counter() - started
        ratios.append(times["ours"] / times["torchattacks"])
        print(
            f"pair {pair + 1}: ours {times['ours']:.1f} s robust {accuracy['ours']:.3f} | "
            f"torchattacks {times['torchattacks']:.1f} s robust {accuracy['torchattacks']:.3f} "
            f"| ratio {ratios[-1]:.3f}",
            flush=True,
        )
    print(f"median ratio ours / torchattacks: {statistics.median(ratios):.3f} (target <= 0.333)")


if __name__ == "__main__":
    main()
