"""The SoK Conv-Small cell, sample by sample: PGD-100, then the complete verifier.

    python bench/sok_conv_small.py [--model sok-cnn-a-adv3] [--eps 0.3] [--timeout 60]
                                   [--samples 0-100] [--verifier complete] [--set k=v ...]

The 100 images of ``examples/sok-mnist.yaml`` (a uniform sample, seed 0, of the MNIST test
set); PGD-100 (step eps / 50, random start, true labels) on each, then ``--verifier`` with
``--timeout`` seconds of CPU (``--clock wall``: of wall time; one torch thread) on each
sample of ``--samples`` (``a-b``, indices into the 100) that PGD-100 did not break (as the
cell does): verdict, margin, CPU and wall seconds. With ``--all`` the samples PGD-100 broke
are verified too, and a certificate on one of them is printed as VIOLATED (certified <=
PGD-100-robust, sample by sample).
``--set`` overrides fields of the verifier's config (YAML values).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import yaml

from aisafety.attack.pgd import PGDLinf
from aisafety.database.zoo import load_zoo_model
from aisafety.interfaces import DatasetSpec
from aisafety.loading import load_data
from aisafety.plugins import default_registry
from aisafety.verification.graph import build_graph
from aisafety.verification.property import robustness_property
from aisafety.verification.registry import make_verifier
from aisafety.verification.result import Verdict

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from shared_location import shared_data  # noqa: E402


def cell_data() -> tuple[torch.Tensor, torch.Tensor]:
    """The cell's 100 images and labels (``examples/sok-mnist.yaml``'s uniform sample)."""
    spec = DatasetSpec(
        name="mnist", path=str(shared_data("mnist")), limit=100, sampling="uniform", seed=0
    )
    data = load_data(spec, default_registry())
    return data.x, data.y


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="sok-cnn-a-adv3")
    parser.add_argument("--eps", type=float, default=0.3)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--samples", default="0-100")
    parser.add_argument("--verifier", default="complete")
    parser.add_argument("--set", nargs="*", default=[])
    parser.add_argument("--all", action="store_true", help="verify PGD-broken samples too")
    parser.add_argument(
        "--clock", choices=["cpu", "wall"], default="cpu", help="what timeout counts"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    x, y = cell_data()
    model = load_zoo_model(args.model)
    attack = PGDLinf({"steps": 100, "step_size": args.eps / 50})
    adv = attack(model, x, y, args.eps).x_adv
    with torch.no_grad():
        robust = model.logits(adv).argmax(1) == y
    first, last = (int(v) for v in args.samples.split("-"))
    config = {"clock": args.clock, "timeout": args.timeout, "batch_size": 1}
    config |= {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)}
    verifier = make_verifier(default_registry(), args.verifier, config)
    graph = build_graph(model.network, model.input_shape, model.name)
    print(f"{args.model} at {args.eps}: PGD-100 robust {int(robust.sum())}/{len(y)}; "
          f"{args.verifier} {config}; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    counts: dict[str, int] = {}
    for s in range(first, min(last, len(y))):
        if not robust[s] and not args.all:
            continue
        prop = robustness_property(x[s : s + 1], y[s : s + 1], args.eps, model.num_classes)
        cpu, wall = time.process_time(), time.perf_counter()
        result = verifier.verify(graph, prop, model.logits)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        verdict = result.verdicts[0]
        counts[verdict.value] = counts.get(verdict.value, 0) + 1
        order = "ok" if verdict is not Verdict.CERTIFIED or robust[s] else "VIOLATED"
        print(f"sample {s:3d} (PGD-100 {'held' if robust[s] else 'broke'}): {verdict.value:<10} "
              f"margin {float(result.margins[0]):9.4g} {cpu:6.1f} cpu s {wall:6.1f} wall s  "
              f"certified<=PGD: "
              f"{order}", flush=True)  # fmt: skip
    print(f"verdicts on the {'' if args.all else 'PGD-robust '}samples of {args.samples}: {counts}")
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
