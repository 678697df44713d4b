"""PGD-100 accuracy of SoK zoo models two ways: ours, and the way the SoK's numbers were taken.

    python bench/sok_pgd100.py [--data-dir ../shared/data/mnist] sok-cnn-a-adv1@0.1 ...

Each argument is ``MODEL@EPS``. Prints the clean accuracy on the full 10,000 MNIST test
images, PGD-100 (l-inf, step eps/50, random start: examples/sok-mnist-pgd100.yaml's attack)
against the true labels, and "SoK-style": the same attack on the model's own clean
predictions, counted robust where the adversarial prediction equals the true label. The
SoK's code (VeriGauge) calls cleverhans' PGD without labels, which does the latter, so a
misclassified image that the attack pushes onto its true class counts as robust
(docs/certification.md, "SoK benchmark on MNIST"). One torch thread.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from aisafety.attack.pgd import PGDLinf
from aisafety.database.zoo import load_zoo_model
from aisafety.interfaces import DatasetSpec
from aisafety.loading import load_data
from aisafety.plugins import default_registry

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from shared_location import shared_data  # noqa: E402

CHUNK = 1000


def measure(name: str, eps: float, x: torch.Tensor, y: torch.Tensor) -> str:
    """One model's clean, PGD-100 and SoK-style accuracy, as a printable line."""
    model = load_zoo_model(name)
    started = time.process_time()
    with torch.no_grad():
        predicted = torch.cat([model.network(c).argmax(1) for c in x.split(CHUNK)])
    attack = PGDLinf({"steps": 100, "step_size": eps / 50})
    true_labels = sok_style = 0
    for start in range(0, len(y), CHUNK):
        xs, ys, ps = (t[start : start + CHUNK] for t in (x, y, predicted))
        true_labels += int((attack(model, xs, ys, eps).adv_pred == ys).sum())
        sok_style += int((attack(model, xs, ps, eps).adv_pred == ys).sum())
    n = len(y)
    return (
        f"{name}: clean {(predicted == y).double().mean():.4f}, PGD-100 at {eps:g} "
        f"{true_labels / n:.4f}, SoK-style {sok_style / n:.4f} "
        f"({time.process_time() - started:.1f} s CPU; load {os.getloadavg()[0]:.2f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="MODEL@EPS, e.g. sok-cnn-a-adv1@0.1")
    parser.add_argument("--data-dir", type=Path, help="default: shared/data/mnist")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data_dir = args.data_dir or shared_data("mnist")
    spec = DatasetSpec(name="mnist", path=str(data_dir), split="test")
    test = load_data(spec, default_registry())
    for item in args.models:
        name, _, eps = item.partition("@")
        print(measure(name, float(eps or 0.1), test.x, test.y), flush=True)


if __name__ == "__main__":
    main()
