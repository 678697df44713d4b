"""``alpha-crown`` layer by layer (``joint: false``) against ``joint: true`` on the tests' small
sigmoid/tanh nets: margins and CPU time, paired (#33: should ``joint`` default on for
S-shape nets?).

    python bench/joint_alpha_small.py [--repeats 3] [--steps 20 75] [--defaults] [--samples 6]

Nets: the tests' two, built by the same calls (aisafety/database/scaled_mlp.py,
``bench/sigmoid_lines.small_nets``): the contract's ``smooth_net`` (tests/test_contract.py;
sigmoid, tanh; eps 0.05, as in the verifier contract) and ``sshape_net``
(tests/test_sshape_relaxation.py; sigmoid, tanh, sigmoid; eps 0.1,
0.2, 0.3), 6 samples each (the tests' ``around``: uniform images, seed 6). Per net, eps
and step count the two modes run interleaved ``--repeats`` times; printed: certified
samples, the sum and least of the margins (the verifier's sound bounds) and the median CPU
seconds of each, and their ratio. ``--defaults``: the old default (``joint: false``, 20
steps) against the tenth session's (``joint: auto``: 75 joint steps with the early stop)
instead of a step count; ``--samples``: samples per case. Run it alone with
OMP_NUM_THREADS=1 (one thread is set here).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # sigmoid_lines, beside this

from sigmoid_lines import small_nets  # noqa: E402

from aisafety.verification.graph import build_graph  # noqa: E402
from aisafety.verification.incomplete import AlphaCrownVerifier  # noqa: E402
from aisafety.verification.property import robustness_property  # noqa: E402

NETS = small_nets()
CASES = [("contract _smooth_net", 0.05)] + [("sshape_net", eps) for eps in (0.1, 0.2, 0.3)]


def around(net: torch.nn.Module, eps: float, n: int = 6):
    """The tests' samples: ``n`` uniform 4x4 images (seed 6), labelled by the net."""
    x = torch.rand(n, 1, 4, 4, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        y = net(x).argmax(1)
    return x, robustness_property(x, y, eps, 3)


def timed(net, graph, prop, steps: int, joint: bool) -> tuple[torch.Tensor, int, float]:
    """Margins, certified count and CPU seconds of one ``alpha-crown`` run (``steps`` 0:
    the defaults, ``joint: false`` for the layerwise side)."""
    config = {"steps": steps, "joint_steps": steps, "joint": joint} if steps else {}
    if not steps and not joint:
        config["joint"] = False
    began = time.process_time()
    result = AlphaCrownVerifier(config).verify(graph, prop, net)
    return result.margins, int(result.certified.sum()), time.process_time() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, nargs="*", default=[20, 75])
    parser.add_argument("--defaults", action="store_true", help="old default against new")
    parser.add_argument("--samples", type=int, default=6)
    args = parser.parse_args()
    steps_list = [0] if args.defaults else args.steps
    torch.set_num_threads(1)
    warm = NETS["sshape_net"]  # the first run pays for lazy imports and allocations
    timed(warm, build_graph(warm, (1, 4, 4), "warm"), around(warm, 0.1)[1], 2, True)
    print(f"{'net':<12} {'eps':>4} {'steps':>5}  mode       cert  sum margin  least   CPU s")
    for net_name, eps in CASES:
        net = NETS[net_name]
        graph = build_graph(net, (1, 4, 4), net_name)
        _, prop = around(net, eps, args.samples)
        for steps in steps_list:
            runs = {False: [], True: []}
            for _ in range(args.repeats):
                for joint in (False, True):  # interleaved: the load hits both alike
                    runs[joint].append(timed(net, graph, prop, steps, joint))
            cpu = {j: statistics.median(r[2] for r in runs[j]) for j in runs}
            for joint, name in ((False, "layerwise"), (True, "joint")):
                margins, certified, _ = runs[joint][0]
                print(f"{net_name.split()[-1]:<12} {eps:>4} {steps:>5}  {name:<10} {certified:>4}"
                      f" {float(margins.sum()):+10.4f} {float(margins.min()):+7.4f}"
                      f" {cpu[joint]:7.2f}")  # fmt: skip
            print(f"{'':<24}joint / layerwise CPU: {cpu[True] / cpu[False]:.2f}", flush=True)


if __name__ == "__main__":
    main()
