"""The verifiers with freed memory reused (``verification/memory.py``) against without.

    python bench/verifier_memory.py [--model sok-cnn-a-adv1] [--eps 0.1] [--images 2]
                                    [--rounds 3] [--verifiers crown alpha-crown]
                                    [--data-dir ../shared/data/mnist]

Each measurement is a fresh process (the allocator's state is per process) that verifies
the same ``--images`` uniformly sampled MNIST test images (the SoK plan's sample) with one
thread, with ``AISAFETY_REUSE_FREED_MEMORY`` on or off; the two alternate in each round.
Printed per verifier: user and system CPU seconds, minor page faults and peak resident
size of each, the paired median ratio of the total CPU (reused / not), and whether the
margins are identical.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist"


def child(args: argparse.Namespace) -> None:
    """One verify call; prints its CPU, page faults and margins as JSON."""
    import torch

    from aisafety.database.zoo import load_zoo_model
    from aisafety.interfaces import DatasetSpec
    from aisafety.loading import load_data
    from aisafety.plugins import default_registry
    from aisafety.verification.graph import build_graph
    from aisafety.verification.property import robustness_property
    from aisafety.verification.registry import make_verifier

    torch.set_num_threads(1)
    registry = default_registry()
    spec = DatasetSpec(name="mnist", path=str(args.data_dir), limit=100, sampling="uniform")
    data = load_data(spec, registry)
    predictor = load_zoo_model(args.model)
    graph = build_graph(predictor.network.cpu(), predictor.input_shape, args.model)
    prop = robustness_property(data.x[: args.images], data.y[: args.images], args.eps, 10)
    verifier = make_verifier(registry, args.child, {"batch_size": args.images, "timeout": 1e6})
    before = resource.getrusage(resource.RUSAGE_SELF)
    result = verifier.verify(graph, prop, predictor.logits)
    after = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({
        "user": after.ru_utime - before.ru_utime, "sys": after.ru_stime - before.ru_stime,
        "faults": after.ru_minflt - before.ru_minflt, "peak_gib": after.ru_maxrss / 2**20,
        "margins": result.margins.tolist(),
    }))  # fmt: skip


def measure(args: argparse.Namespace, verifier: str, reuse: bool) -> dict:
    env = {**os.environ, "AISAFETY_REUSE_FREED_MEMORY": "1" if reuse else "0"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    command = [sys.executable, __file__, "--child", verifier, "--model", args.model,
               "--eps", str(args.eps), "--images", str(args.images),
               "--data-dir", str(args.data_dir)]  # fmt: skip
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="sok-cnn-a-adv1")
    parser.add_argument("--eps", type=float, default=0.1)
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--verifiers", nargs="+", default=["crown", "alpha-crown"])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    print(f"{args.model}, eps {args.eps}, {args.images} images, one thread, fresh processes")
    for verifier in args.verifiers:
        ratios, same = [], True
        for r in range(args.rounds):
            order = (True, False) if r % 2 == 0 else (False, True)
            runs = {reuse: measure(args, verifier, reuse) for reuse in order}
            kept, fresh = runs[True], runs[False]
            ratios.append((kept["user"] + kept["sys"]) / (fresh["user"] + fresh["sys"]))
            same &= kept["margins"] == fresh["margins"]
            for name, run in (("reused", kept), ("not reused", fresh)):
                print(f"  {verifier} round {r} {name:>10}: user {run['user']:6.1f} s, "
                      f"system {run['sys']:6.1f} s, {run['faults']:>9,} page faults, "
                      f"peak resident {run['peak_gib']:.2f} GiB")  # fmt: skip
        print(f"{verifier}: CPU reused / not reused, paired median {statistics.median(ratios):.3f};"
              f" margins identical: {same}")  # fmt: skip


if __name__ == "__main__":
    main()
