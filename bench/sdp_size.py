"""How SDPVerify and LMIVerify grow with the SDP's side N (1 + inputs + unstable hidden
neurons): CPU seconds and peak resident size of one spec row on random 2-hidden-layer ReLU
nets, at growing input sizes, for the "which verifier when" table's cost statement (the
SoK's MNIST models have N = 825 to 4,389, past ``max_size``).

    python bench/sdp_size.py [--inputs 8 16 32 64 96] [--hidden 10]

Each size runs in a fresh process, one thread; prints N, the CPU seconds of the solve and
the process's peak resident size.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def child(inputs: int, hidden: int, name: str) -> None:
    import torch
    from torch import nn

    from aisafety.plugins import default_registry
    from aisafety.verification.graph import build_graph
    from aisafety.verification.property import robustness_property
    from aisafety.verification.quadratic import size_of
    from aisafety.verification.registry import make_verifier

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                        nn.ReLU(), nn.Linear(hidden, 2)).eval()  # fmt: skip
    graph = build_graph(net, (inputs,), "random")
    x = torch.full((1, inputs), 0.5)
    prop = robustness_property(x, net(x).argmax(1), 0.5, 2)  # wide: every neuron unstable
    verifier = make_verifier(default_registry(), name, {"max_size": 10_000})
    began = time.process_time()
    bound = float(verifier.lower_bounds(graph, prop)[0])
    print(json.dumps({"verifier": name, "n": size_of(graph), "cpu_s": time.process_time() - began,
                      "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "bound": bound}))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", nargs="+", type=int, default=[8, 16, 32, 64, 96])
    parser.add_argument("--hidden", type=int, default=10)
    parser.add_argument("--child", nargs=3)
    args = parser.parse_args()
    if args.child:
        child(int(args.child[0]), int(args.child[1]), args.child[2])
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    for inputs in args.inputs:
        for name in ("sdpverify", "lmiverify"):
            command = [sys.executable, __file__, "--child", str(inputs), str(args.hidden), name]
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            print(out.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
