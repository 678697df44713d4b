"""Could the network's confidence at a box's centre tell a ResNet box moved back to [0, 1]
pixels (x * std + mean) from the box as written, with nothing declared?

    python bench/centre_confidence.py

For the 72 CIFAR-10 ResNet properties of ../shared/data, each against both ResNets (144
pairs, as bench/input_space.py pairs them), as
written and moved to [0, 1] pixels: whether the network gives the property's class L at the
box's centre (what ``check_centre_class`` warns on), and there the logit margin (y_L minus
the largest other) and the softmax probability of L (onnxruntime, no verifier). A threshold
is a check only if every box as written lies on one side of it and moved boxes that keep
class L on the other. Last, the other reading: how much the margin grows when the centre is
normalised with CIFAR-10's mean and std (a moved box is then the box as written again).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from input_space import MEAN, SPREAD, logits, pairs  # noqa: E402

from aisafety.verification.input_space import protected_class  # noqa: E402
from aisafety.verification.vnnlib import read_disjuncts  # noqa: E402


def reading(network: Path, lower, upper, label: int) -> tuple[bool, float, float]:
    """(class L given, logit margin of L, softmax probability of L) at the box's centre."""
    y = logits(network, (lower + upper) / 2)[0].double()
    others = torch.cat([y[:label], y[label + 1 :]])
    return int(y.argmax()) == label, float(y[label] - others.max()), float(y.softmax(0)[label])


def summary(name: str, rows: list[tuple[bool, float, float]]) -> None:
    kept = [r for r in rows if r[0]]
    margins = sorted(r[1] for r in kept)
    probs = sorted(r[2] for r in kept)
    quart = [margins[len(margins) * k // 4] for k in range(4)] + [margins[-1]] if kept else []
    print(f"{name:22s} class kept {len(kept):3d}/{len(rows)}; where kept: margin "
          f"{' '.join(f'{m:.2f}' for m in quart)} (min q1 median q3 max), p(L) min "
          f"{probs[0] if kept else float('nan'):.3f} median "
          f"{probs[len(probs) // 2] if kept else float('nan'):.3f}")  # fmt: skip


def main() -> None:
    began = time.process_time()
    resnet = [(n, s) for n, s in pairs() if n.name.startswith("resnet")]
    networks = sorted({n for n, _ in resnet})
    specs = sorted({s for _, s in resnet})
    written, moved, paired, gains = [], [], [], {"written": [], "moved": []}
    for spec in specs:  # every box against both ResNets, as bench/input_space.py pairs them
        (lower, upper), disjuncts = read_disjuncts(spec, 3072, 10)
        label = protected_class(disjuncts)
        for network in networks:
            written.append(reading(network, lower, upper, label))
            if (network, spec) in resnet:
                paired.append(written[-1])
            pixels = (lower * SPREAD + MEAN, upper * SPREAD + MEAN)
            moved.append(reading(network, *pixels, label))
            for kind, (lo, hi) in (("written", (lower, upper)), ("moved", pixels)):
                normalised = ((lo - MEAN) / SPREAD, (hi - MEAN) / SPREAD)
                gains[kind].append(
                    reading(network, *normalised, label)[1] - reading(network, lo, hi, label)[1]
                )
    summary("as written", written)
    summary("as the benchmark pairs", paired)
    summary("moved to [0, 1] pixels", moved)
    print("a margin threshold t (warn where class L is kept with a margin below t):")
    for t in (0.25, 0.5, 1.0, 1.5, 2.0):
        caught = sum(1 for r in moved if r[0] and r[1] < t)
        false = sum(1 for r in written if r[0] and r[1] < t)
        own = sum(1 for r in paired if r[0] and r[1] < t)
        print(f"  t {t:4.2f}: moved caught {caught:3d} more, written warned {false:3d} "
              f"({own} of the {len(paired)} as paired)")  # fmt: skip
    print("the margin gained by reading the centre normalised, (x - mean) / std (min median max):")
    for kind, values in gains.items():
        values = sorted(values)
        print(f"  {kind:8s} {values[0]:.2f} {values[len(values) // 2]:.2f} {values[-1]:.2f}")
    print(f"CPU {time.process_time() - began:.1f} s")


if __name__ == "__main__":
    main()
