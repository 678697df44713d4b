"""Cost of RDI and of the adversarial-hypervolume grid, and AH's grid-size error (issue 14).

    python bench/frontier.py [--threads 2] [--repeat 3] [--images 1000] [--grid-images 200]

1. RDI (one hooked forward pass + the statistics) against a PGD-40 evaluation (l-inf,
   eps 0.3, no early stop: every sample takes 40 steps, as an evaluation reports it) on the
   same shipped 1,000 test images, for ``mnist-cnn``. The RDI paper reports 1/30; target <= 1/30.
2. The AH frontier search (10 budgets x 10 warm-started APGD steps, eps_max 0.3) against one
   APGD-MAR run (100 steps) at eps_max on the same images, for a vanilla and a robust model.
   Target <= 2x. Also prints each side's robust accuracy at eps_max: the grid's search must
   be about as strong as the single attack there.
3. AH for N = 5, 10, 20, 50 budgets (10 steps each), for 5, 10, 20 steps per budget at N = 10,
   and for the logit-margin search objective, on ``--grid-images`` images of three models:
   the approximation error of the paper's Section III-D, measured.

Times alternate the two sides of each ratio (load from other work hits both alike) and report
the median of the per-pair ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from aisafety.attack.apgd import APGDMargin
from aisafety.attack.pgd import PGDLinf
from aisafety.database.datasets.embedded import EmbeddedMnist
from aisafety.database.zoo import load_zoo_model
from aisafety.evaluation.features import extract_features
from aisafety.evaluation.frontier import adversarial_frontier
from aisafety.evaluation.metrics.feature_separation import rdi
from aisafety.evaluation.metrics.hypervolume import hypervolume
from aisafety.interfaces import Norm

CHUNK = 128  # what the evaluation context hands each call on the CPU


def seconds(run) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def paired_ratio(numerator, denominator, repeat: int) -> tuple[float, float, float]:
    """Median over ``repeat`` back-to-back pairs of numerator/denominator, and the medians.
    Each side is called with ``warm_up=True`` once first (a few images: lazy set-up only)."""
    numerator(warm_up=True), denominator(warm_up=True)
    tops, bottoms = [], []
    for _ in range(repeat):
        tops.append(seconds(numerator))
        bottoms.append(seconds(denominator))
    ratio = statistics.median(t / b for t, b in zip(tops, bottoms, strict=True))
    return ratio, statistics.median(tops), statistics.median(bottoms)


def frontier(model, x, y, n_budgets: int, steps: int, loss: str = "prob", eps_max: float = 0.3):
    """AH per sample and the frontier; ``loss`` "prob" is what the measurements in
    docs/metrics.md used (the default then)."""
    budgets = tuple(eps_max * i / n_budgets for i in range(1, n_budgets + 1))
    parts = [
        adversarial_frontier(model, xb, yb, budgets, Norm.LINF, steps, loss)
        for xb, yb in zip(x.split(CHUNK), y.split(CHUNK), strict=True)
    ]
    margins = torch.cat([p.margins for p in parts])
    levels = torch.tensor(budgets, dtype=torch.float64) / eps_max
    return hypervolume(levels, margins[:, 1:]), margins


def rdi_vs_pgd(data, repeat: int) -> None:
    model = load_zoo_model("mnist-cnn")
    pgd = PGDLinf(steps=40)

    def run_rdi(warm_up: bool = False):
        features = extract_features(model, data.x[:8] if warm_up else data.x)
        rdi(features.vectors, features.predicted)

    def run_pgd(warm_up: bool = False):
        n = 8 if warm_up else len(data)
        pgd(model, data.x[:n], data.y[:n], 0.3, chunk_size=CHUNK)

    ratio, t_rdi, t_pgd = paired_ratio(run_rdi, run_pgd, repeat)
    print(
        f"RDI {t_rdi:.3f} s, PGD-40 {t_pgd:.2f} s on {len(data)} images: RDI / PGD-40 = "
        f"{ratio:.4f} = 1/{1 / ratio:.0f} (target <= 1/30)"
    )


def grid_vs_apgd(data, repeat: int) -> None:
    apgd = APGDMargin(steps=100)
    for name in ("mnist-cnn", "mnist-cnn-pgd-at"):
        model = load_zoo_model(name)
        out = {}

        def run_grid(warm_up: bool = False, model=model, out=out):
            n = 8 if warm_up else len(data)
            out["grid"] = frontier(model, data.x[:n], data.y[:n], 10, 10)[1]

        def run_apgd(warm_up: bool = False, model=model, out=out):
            n = 8 if warm_up else len(data)
            out["apgd"] = apgd(model, data.x[:n], data.y[:n], 0.3, chunk_size=CHUNK)

        ratio, t_grid, t_apgd = paired_ratio(run_grid, run_apgd, repeat)
        margins, attacked = out["grid"], out["apgd"]
        print(
            f"{name}: AH grid (10 budgets x 10 steps) {t_grid:.2f} s, APGD-MAR-100 at 0.3 "
            f"{t_apgd:.2f} s: ratio {ratio:.2f} (target <= 2); robust accuracy at 0.3: "
            f"grid {float((margins[:, -1] > 0).double().mean()):.3f}, "
            f"APGD-MAR {attacked.robust_accuracy:.3f}"
        )


def grid_size(data) -> None:
    print(f"\nAH (mean over {len(data)} images) against the grid (l-inf, eps_max 0.3)")
    rows = [("budgets", n, 10, "prob") for n in (5, 10, 20, 50)]
    rows += [("steps", 10, s, "prob") for s in (5, 20)]
    rows += [("loss", 10, 10, "logit")]
    print("model                  N   steps  loss   AH       std      change vs N=10")
    for name in ("mnist-cnn", "mnist-cnn-pgd-at", "mnist-cnn-ah"):
        model = load_zoo_model(name)
        reference, _ = frontier(model, data.x, data.y, 10, 10)
        for _, n, steps, loss in rows:
            ah, _ = (
                (reference, None)
                if (n, steps, loss) == (10, 10, "prob")
                else frontier(model, data.x, data.y, n, steps, loss)
            )
            change = float(ah.mean() - reference.mean())
            print(
                f"{name:22} {n:3d} {steps:5d}   {loss:5}  {float(ah.mean()):.4f}   "
                f"{float(ah.std()):.4f}   {change:+.4f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--grid-images", type=int, default=200)
    parser.add_argument("--skip", nargs="*", default=[], choices=["rdi", "ah", "grid"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shipped = EmbeddedMnist().load(None, "test")
    data = shipped.balanced_subset(args.images, seed=0) if args.images < len(shipped) else shipped
    if "rdi" not in args.skip:
        rdi_vs_pgd(data, args.repeat)
    if "ah" not in args.skip:
        grid_vs_apgd(data, args.repeat)
    if "grid" not in args.skip:
        grid_size(shipped.balanced_subset(args.grid_images, seed=0))


if __name__ == "__main__":
    main()
