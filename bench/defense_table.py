"""docs/defenses.md's comparison table: every defense the AISafety paper names, on MNIST.

    OMP_NUM_THREADS=1 python bench/defense_table.py [--rows ENTRY ...] [--eps 0.3] [--every 5]

One markdown row per defense, all on every ``--every``-th image (default 5: 200 images, 20
per class) of the embedded 1,000-image MNIST test subset, l-inf eps 0.3; the 200 are the
images the costliest zoo entries record their robustness on (``robust_every``):

- CA: clean accuracy;
- AAW PGD-40: accuracy under the platform's ``pgd-linf`` (40 steps of 2.5 eps / 40, random
  start, seed 0), white-box through the whole defended model;
- AAW adaptive: accuracy on the samples that survive both PGD-40 and the attack the defense's
  own paper or its later break requires (per sample, the worst case): a zoo entry's training
  defense names it (``TrainingDefense.adaptive_correct``: BPDA and LS-PGA for thermometer
  encoding, a transfer attack for HGD and SAT), an input defense uses its own BPDA / EOT
  setting, and every other row APGD-DLR (Croce & Hein 2020's margin-type loss, which is what
  breaks gradient masking by a saturated softmax as in distillation);
- CAV, CRR, CSR, CCV, COS: the platform's defense-cost metrics against the undefended
  ``mnist-cnn`` (AISafety eqs. 15-19).

For a zoo entry measured on the same images (its ``robust_every`` equals ``--every``) the
PGD-40 and adaptive numbers must equal the manifest's (same images, same seeds); the script
says so when they do not.
A defense whose model is not in the zoo prints its row with "not shipped".
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import torch

from aisafety.attack.apgd import APGDDLR
from aisafety.attack.pgd import PGDLinf
from aisafety.database.datasets.base import LoadedDataset
from aisafety.database.datasets.embedded import EmbeddedMnist
from aisafety.database.zoo import list_models, load_zoo_model
from aisafety.defense.jpeg import JpegCompression
from aisafety.defense.resize_pad import RandomResizePad
from aisafety.evaluation.context import EvaluationContext
from aisafety.evaluation.metrics.defense_cost import (
    ClassificationAccuracyVariance,
    ClassificationConfidenceVariance,
    ClassificationOutputStability,
    ClassificationRectifyRatio,
    ClassificationSacrificeRatio,
)
from aisafety.prediction.base import Predictor
from aisafety.zoo_build import training_defense

Correct = Callable[[Predictor, torch.Tensor, torch.Tensor, float], torch.Tensor]


@dataclass(frozen=True)
class Row:
    paper: str  # the defense and its paper, as the AISafety paper cites it
    ours: str  # zoo entry, or input defense on mnist-cnn
    build: Callable[[], Predictor] | None  # None: not shipped
    adaptive: str  # the adaptive attack, in words
    adaptive_correct: Correct | None = None  # None: the zoo entry's training defense's


def zoo(name: str) -> Callable[[], Predictor] | None:
    return (lambda: load_zoo_model(name)) if name in list_models() else None


def apgd_dlr(predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float) -> torch.Tensor:
    return APGDDLR()(predictor, x, y, eps).adv_pred == y


def own_bpda(predictor: Predictor, x: torch.Tensor, y: torch.Tensor, eps: float) -> torch.Tensor:
    """PGD-40 on the input defense as configured (its ``bpda`` / ``eot_samples``)."""
    return PGDLinf({"steps": 40})(predictor, x, y, eps).adv_pred == y


ROWS = [
    Row("SAT, Goodfellow et al. 2015", "mnist-cnn-sat", zoo("mnist-cnn-sat"),
        "transfer PGD-40 from mnist-cnn (Tramer et al. 2018)"),
    Row("PGD-AT (PAT), Madry et al. 2018", "mnist-cnn-pgd-at", zoo("mnist-cnn-pgd-at"),
        "APGD-DLR", apgd_dlr),
    Row("TRADES, Zhang et al. 2019", "mnist-cnn-trades-5", zoo("mnist-cnn-trades-5"),
        "APGD-DLR", apgd_dlr),
    Row("Ensemble AT, Tramer et al. 2018", "mnist-cnn-ensemble-at",
        zoo("mnist-cnn-ensemble-at"),
        "white-box PGD-40 itself (the paper's threat model is transfer: see its section)",
        lambda p, x, y, eps: torch.ones_like(y, dtype=torch.bool)),
    Row("Deep Defense, Yan et al. 2018", "mnist-cnn-deep-defense",
        zoo("mnist-cnn-deep-defense"), "APGD-DLR"),
    Row("Parseval networks, Cisse et al. 2017", "mnist-cnn-parseval",
        zoo("mnist-cnn-parseval"), "APGD-DLR"),
    Row("Defensive distillation, Papernot et al. 2016", "mnist-cnn-distillation",
        zoo("mnist-cnn-distillation"), "APGD-DLR (C&W 2017's point: a margin loss)", apgd_dlr),
    Row("HGD, Liao et al. 2018", "mnist-cnn-hgd", zoo("mnist-cnn-hgd"),
        "transfer PGD-40 from mnist-cnn (the paper's oblivious attacker)"),
    Row("Thermometer encoding, Buckman et al. 2018", "mnist-cnn-thermometer",
        zoo("mnist-cnn-thermometer"), "BPDA PGD-40 and LS-PGA-40 (Athalye et al. 2018)"),
    Row("Rand (resize and pad), Xie et al. 2018", "mnist-cnn + resize-pad 1.25",
        lambda: RandomResizePad(load_zoo_model("mnist-cnn"), canvas_scale=1.25),
        "EOT over 16 draws",
        lambda p, x, y, eps: own_bpda(RandomResizePad(p.inner, canvas_scale=1.25,
                                                      eot_samples=16), x, y, eps)),
    Row("JPEG, Dziugaite et al. 2016", "mnist-cnn + jpeg 50",
        lambda: JpegCompression(load_zoo_model("mnist-cnn"), quality=50), "BPDA",
        lambda p, x, y, eps: own_bpda(JpegCompression(p.inner, quality=50, bpda=True),
                                      x, y, eps)),
    Row("Certified training (the paper's [35]-[37]; ours CROWN-IBP, Zhang et al. 2020)",
        "mnist-cnn-strided-crown-ibp", zoo("mnist-cnn-strided-crown-ibp"), "APGD-DLR",
        apgd_dlr),
]  # fmt: skip

COSTS = [
    ClassificationAccuracyVariance,
    ClassificationRectifyRatio,
    ClassificationSacrificeRatio,
    ClassificationConfidenceVariance,
    ClassificationOutputStability,
]


def measure(row: Row, eps: float, every: int = 5) -> list[str]:
    full = EmbeddedMnist().load(None, "test")
    data = LoadedDataset(full.name, full.x[::every], full.y[::every], full.classes)
    if row.build is None:
        return ["not shipped"] * 3 + ["—"] * len(COSTS)
    predictor = row.build()
    x, y = data.x, data.y
    survived = PGDLinf({"steps": 40})(predictor, x, y, eps).adv_pred == y
    adaptive = row.adaptive_correct
    if adaptive is None:
        entry = list_models()[row.ours][0]
        adaptive = training_defense(entry.recipe.defense, entry.recipe.defense_config)
        adaptive = adaptive.adaptive_correct
    extra = adaptive(predictor, x, y, eps)
    if extra is None:  # the training defense names no attack beyond PGD: APGD-DLR
        extra = apgd_dlr(predictor, x, y, eps)
    worst = survived & extra
    pgd, adv = survived.double().mean().item(), worst.double().mean().item()
    recorded = list_models()[row.ours][0].metrics if row.ours in list_models() else {}
    if recorded.get("robust_every", 1) == every:  # measured on the same images
        for key, value in (("pgd40_robust_accuracy", pgd), ("adaptive_robust_accuracy", adv)):
            claim = recorded.get(f"{key}_eps{eps:g}")
            if claim is not None and abs(claim - value) > 0.003:
                print(f"# {row.ours}: {key} {value:.3f} here, the manifest records {claim:.3f}")
    ctx = EvaluationContext(
        predictor, data, make_attack=None, reference=load_zoo_model("mnist-cnn")
    )
    with torch.no_grad():
        clean = ctx.clean_correct.double().mean().item()
        costs = [metric().compute(ctx).value for metric in COSTS]
    return [f"{clean:.3f}", f"{pgd:.3f}", f"{adv:.3f}", *(f"{c:+.3f}" for c in costs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="*", help="zoo entries / labels of the rows to measure")
    parser.add_argument("--eps", type=float, default=0.3)
    parser.add_argument(
        "--every", type=int, default=5, help="every K-th of the 1,000 images (5: 200 images)"
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    print("| defense (paper) | ours | CA | AAW PGD-40 | adaptive attack | AAW adaptive "
          "| CAV | CRR | CSR | CCV | COS |")  # fmt: skip
    print("|---" * 11 + "|")
    for row in ROWS:
        if args.rows and row.ours not in args.rows:
            continue
        ca, pgd, adv, *costs = measure(row, args.eps, args.every)
        cells = [row.paper, f"`{row.ours}`", ca, pgd, row.adaptive, adv, *costs]
        print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
