"""`aisafety verify`'s answer on every CIFAR-10 VNN-COMP instance of ../shared/data.

    python bench/verify_cifar10.py [--verifier crown] [--timeout 30] [--nets resnet_2b ...]
                                   [--pgd-check]

Runs every row of ``cifar10-models/*/instances.csv`` (resnet_2b, resnet_4b and the three
Marabou nets, 144 instances) through ``verify_instance`` in one process (each network is
converted once) and prints, per instance, the status, wall and CPU seconds and the process's
peak memory; each ``sat`` counterexample is replayed through a fresh onnxruntime session on
the original file (batch 1, the graph's own input shape) and must lie in the box and
satisfy the property there. With ``--pgd-check`` every ``unsat`` is attacked once more
(box-PGD, 200 steps, 5 random restarts, replayed through onnxruntime): a hit would print
``UNSOUND``. Ends with the counts per network and status. An error on any instance is
printed and counted, not raised.
"""

from __future__ import annotations

import argparse
import math
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from shared_location import shared_data  # noqa: E402
from vnncomp_cifar10 import instances, replays  # noqa: E402


def broken_by_pgd(network: Path, spec: Path) -> bool:
    """An independent try at an unsat instance: box-PGD (200 steps, 5 random restarts) on
    each disjunct's largest row, replayed through onnxruntime: True would mean unsound."""
    import torch

    from aisafety.verification.falsify import into_box, pgd_on_rows
    from aisafety.verification.property import Property
    from aisafety.verification.vnncomp import load_network
    from aisafety.verification.vnnlib import read_disjuncts

    net = load_network(str(network))
    (lower, upper), disjuncts = read_disjuncts(spec, math.prod(net.shape), 10)
    lower, upper = lower.reshape(1, *net.shape), upper.reshape(1, *net.shape)
    for rows in disjuncts:
        spec_rows = torch.stack([c for c, _ in rows]).unsqueeze(0)
        offset = torch.tensor([[d for _, d in rows]], dtype=torch.float64)
        prop = Property(lower, upper, spec_rows, offset)

        def largest(x, prop=prop):
            return prop.rows(net.graph.forward(x.double())).amax(1, keepdim=True)

        single = Property(lower, upper, torch.ones(1, 1, 1, dtype=torch.float64), offset[:, :1] * 0)
        x = into_box(pgd_on_rows(largest, single, steps=200, restarts=5, seed=1), prop)
        if bool(prop.inside(x)[0]) and bool((prop.rows(net.run(x).double()) <= 0).all()):
            return True
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verifier", default="crown")
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--nets", nargs="*", default=None, help="network file stems")
    parser.add_argument(
        "--pgd-check", action="store_true", help="attack every unsat (PGD-200, 5 restarts)"
    )
    args = parser.parse_args()
    from aisafety.plugins import default_registry
    from aisafety.verification.vnncomp import verify_instance

    registry = default_registry()
    counts: dict[tuple[str, str], int] = {}
    for network, spec, _ in instances(shared_data("cifar10-models")):
        if args.nets and network.stem not in args.nets:
            continue
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            result = verify_instance(registry, network, spec, args.verifier, args.timeout)
            status = result.status
            if status == "sat" and not replays(network, spec, result.counterexample):
                status = "BAD-SAT"
            if status == "unsat" and args.pgd_check and broken_by_pgd(network, spec):
                status = "UNSOUND"
        except Exception as exc:  # noqa: BLE001  counted and printed, the sweep goes on
            status = f"ERROR {type(exc).__name__}: {exc}"[:200]
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
        key = (network.stem, status.split(":")[0])
        counts[key] = counts.get(key, 0) + 1
        print(f"{network.stem:<15} {spec.name:<66} {status:<8} {wall:6.1f} s wall "
              f"{cpu:6.1f} s cpu  peak {peak:.2f} GB", flush=True)  # fmt: skip
    print(f"verifier {args.verifier}, timeout {args.timeout:g} s per instance")
    for (net, status), n in sorted(counts.items()):
        print(f"  {net:<15} {status:<8} {n}")


if __name__ == "__main__":
    main()
