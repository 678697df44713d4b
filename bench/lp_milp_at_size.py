"""The LP / MILP verifiers (and any other named) on the at-size shapes, one image each.

    OMP_NUM_THREADS=1 python bench/lp_milp_at_size.py resnet-50 lp-full k-relu complete bab

``tests/test_at_size.py`` verifies only the images its attack leaves standing, and on a
random-weight net with real labels that is none: its verifier rows never reach the
verifier. Here the property is the net's own prediction on one random image (so the attack
cannot end it first), at 1/255, with a 5 CPU-second limit per image. Each verifier prints
its verdict and CPU seconds, or its refusal (``MemoryBudgetError`` naming the estimate and
the budget, or the op it cannot bound) and the CPU seconds before it.
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from shapes import build  # noqa: E402

from aisafety.errors import MemoryBudgetError  # noqa: E402
from aisafety.plugins import default_registry  # noqa: E402
from aisafety.verification.graph import VerificationError, build_graph  # noqa: E402
from aisafety.verification.property import robustness_property  # noqa: E402
from aisafety.verification.registry import make_verifier  # noqa: E402

ATTACK_FIRST = ("complete", "bab", "alpha-crown")


def main(shape: str, names: list[str]) -> None:
    net, input_shape, classes = build(shape)
    graph = build_graph(net, input_shape, shape)
    x = torch.rand(1, *input_shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        prop = robustness_property(x, net(x).argmax(1), 1 / 255, classes)
    for name in names:
        extra = {"attack_steps": 2} if name in ATTACK_FIRST else {}
        config = {"timeout": 5, "clock": "cpu", **extra}
        verifier = make_verifier(default_registry(), name, config)
        began = time.process_time()
        try:
            result = verifier.verify(graph, prop, net)
        except (MemoryBudgetError, VerificationError) as refusal:
            cpu = time.process_time() - began
            print(f"{shape} {name}: refused after {cpu:.1f} CPU s: {refusal}", flush=True)
            continue
        cpu = time.process_time() - began
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        margin, note = float(result.margins[0]), result.notes[0]
        print(
            f"{shape} {name}: {result.verdicts[0]} (margin {margin:.3g}, {note!r}), "
            f"{cpu:.1f} CPU s, process peak {peak:.2f} GiB",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
