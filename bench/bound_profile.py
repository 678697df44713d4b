"""Where CROWN's time goes: torch.profiler's op table for one network of ``bound_speed.py``.

    python3 bench/bound_profile.py 256x6 [--images 8] [--rows 12]

Prints our CROWN time (one thread, ``time.process_time``) for the float64 and float32
graphs, then the ops that took the most self CPU time in one float64 run (the profiler
inflates absolute times; read the shares).
"""

from __future__ import annotations

import argparse

import torch
from bound_speed import networks, normalised, ours, plain_module

from aisafety.database.datasets.embedded import EmbeddedMnist
from aisafety.verification.graph import build_graph
from aisafety.verification.property import robustness_property


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("network", help="256x2, 256x4, 256x6 or sok-cnn-a-adv1")
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--rows", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = EmbeddedMnist().load(None, "test")
    x, y = data.x[: args.images], data.y[: args.images]
    for name, network, shape, eps in networks():
        if name != args.network:
            continue
        prop = robustness_property(x.reshape(-1, *shape), y, eps, 10)
        prop, module = normalised(prop, network, shape, name), plain_module(network, shape, name)
        graphs = {
            d: build_graph(module, shape, name, dtype=d) for d in (torch.float64, torch.float32)
        }
        for dtype, graph in graphs.items():
            ours(graph, prop)  # warm-up
            print(f"{name} {dtype}: {ours(graph, prop)[0]:.3f} s")
        with torch.profiler.profile() as profile:
            ours(graphs[torch.float64], prop)
        print(profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
        return
    raise SystemExit(f"no network {args.network!r}")


if __name__ == "__main__":
    main()
