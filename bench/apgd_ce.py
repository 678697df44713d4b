"""Our APGD-CE, as `standard` runs it, against torchattacks' APGD (CE) at the same budget.

Both on the same images and model, one thread, CPU time of this process, interleaved rounds,
paired medians. Printed per side: the model's forward passes and the sample-passes (images
through the model, summed over passes) counted by a wrapper around the network, so extra
work (a clean pass, checks, restarts) shows apart from overhead per pass; and for ours the
number of distinct batch sizes (early stop shrinks the batch as samples fall: on a GPU each
new size is a cuDNN plan for every convolution and direction); and the robust accuracy.

    OMP_NUM_THREADS=1 python bench/apgd_ce.py --images 200 --steps 100 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from aisafety.database.datasets.embedded import EmbeddedMnist
from aisafety.database.zoo import load_zoo_model
from aisafety.plugins import default_registry


class Counted(nn.Module):
    """The network, counting its passes and the images through them."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network, self.sizes = network, []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.sizes.append(len(x))
        return self.network(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="mnist-cnn-pgd-at-ft2")
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--eps", type=float, default=0.3)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from torchattacks import APGD

    data = EmbeddedMnist().load(None, "test").balanced_subset(args.images, seed=0)
    predictor = load_zoo_model(args.model)
    counted = Counted(predictor.network.eval())
    predictor.network = counted
    config = {"steps": args.steps, "early_stop": True, "seed": 0}  # as `standard` sets them
    ours = default_registry().create("attack", "apgd-ce", config)
    clean = predictor.logits(data.x)  # `standard` hands its members the clean logits

    def run_ours() -> float:
        result = ours(
            predictor, data.x, data.y, args.eps, chunk_size=len(data.x), clean_logits=clean
        )
        return float((~result.success).double().mean())

    def run_theirs() -> float:
        attack = APGD(counted, norm="Linf", eps=args.eps, steps=args.steps, n_restarts=1,
                      loss="ce", seed=0)  # fmt: skip
        x_adv = attack(data.x, data.y)
        with torch.no_grad():
            return float((counted(x_adv).argmax(1) == data.y).double().mean())

    seconds: dict[str, list[float]] = {"ours": [], "theirs": []}
    for round_ in range(args.rounds):
        for side, run in (("ours", run_ours), ("theirs", run_theirs)):
            counted.sizes.clear()
            started = time.process_time()
            robust = run()
            seconds[side].append(time.process_time() - started)
            if round_ == 0:
                sizes = counted.sizes
                print(f"{side:6}: robust {robust:.3f}, {len(sizes)} passes, {sum(sizes)} "
                      f"sample-passes, {len(set(sizes))} distinct batch sizes")  # fmt: skip
    ratio = statistics.median(
        a / b for a, b in zip(seconds["ours"], seconds["theirs"], strict=True)
    )
    print(f"{args.model}, {args.images} images, {args.steps} steps, l-inf {args.eps}, 1 thread: "
          f"ours {statistics.median(seconds['ours']):.2f} CPU s, torchattacks "
          f"{statistics.median(seconds['theirs']):.2f} CPU s, ours/torchattacks {ratio:.3f} "
          f"(paired median of {args.rounds})")  # fmt: skip


if __name__ == "__main__":
    main()
