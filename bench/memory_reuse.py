"""Verifiers and attacks with freed memory reused (``aisafety/memory.py``) against without.

    python bench/memory_reuse.py [--rounds 3] [--verifiers crown alpha-crown]
                                 [--attacks pgd-linf] [--chunks 128 1000]
                                 [--data-dir ../shared/data/mnist]

Each measurement is a fresh process (the allocator's state is per process) with one thread
and ``AISAFETY_REUSE_FREED_MEMORY`` on or off; the two alternate in each round.
- Verifiers: ``sok-cnn-a-adv1`` at eps 0.1 on 2 uniformly sampled MNIST test images (the
  SoK plan's sample), one batch.
- Attacks: 20 steps at eps 0.3 on ``mnist-cnn`` over 1,000 test images, in chunks of each
  ``--chunks`` size (128 is the CPU default).
Printed per case: user and system CPU seconds, minor page faults and peak resident size of
each side, the paired median ratio of the total CPU (reused / not), and whether the outputs
(margins, adversarial examples) are identical.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from shared_location import shared_data  # noqa: E402


def child(kind: str, name: str, chunk: int, data_dir: Path) -> None:
    """One verify or attack call; prints its CPU, page faults and output digest as JSON."""
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
    limit = 100 if kind == "verifier" else 1000
    spec = DatasetSpec(name="mnist", path=str(data_dir), limit=limit, sampling="uniform")
    data = load_data(spec, registry)
    if kind == "verifier":
        predictor = load_zoo_model("sok-cnn-a-adv1")
        graph = build_graph(predictor.network.cpu(), predictor.input_shape, "sok-cnn-a-adv1")
        prop = robustness_property(data.x[:2], data.y[:2], 0.1, 10)
        verifier = make_verifier(registry, name, {"batch_size": 2, "timeout": 1e6})
        before = resource.getrusage(resource.RUSAGE_SELF)
        output = verifier.verify(graph, prop, predictor.logits).margins
    else:
        predictor = load_zoo_model("mnist-cnn")
        attack = registry.create("attack", name, {"steps": 20})
        before = resource.getrusage(resource.RUSAGE_SELF)
        output = attack(predictor, data.x, data.y, 0.3, chunk_size=chunk).x_adv
    after = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({
        "user": after.ru_utime - before.ru_utime, "sys": after.ru_stime - before.ru_stime,
        "faults": after.ru_minflt - before.ru_minflt, "peak_gib": after.ru_maxrss / 2**20,
        "digest": float(output.double().sum()),
    }))  # fmt: skip


def measure(case: tuple[str, str, int], data_dir: Path, reuse: bool) -> dict:
    env = {**os.environ, "AISAFETY_REUSE_FREED_MEMORY": "1" if reuse else "0"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    kind, name, chunk = case
    command = [sys.executable, __file__, "--child", kind, name, str(chunk),
               "--data-dir", str(data_dir)]  # fmt: skip
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def report(case: tuple[str, str, int], data_dir: Path, rounds: int) -> None:
    kind, name, chunk = case
    label = name if kind == "verifier" else f"{name} chunk {chunk}"
    ratios, same = [], True
    for r in range(rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        runs = {reuse: measure(case, data_dir, reuse) for reuse in order}
        kept, fresh = runs[True], runs[False]
        ratios.append((kept["user"] + kept["sys"]) / (fresh["user"] + fresh["sys"]))
        same &= kept["digest"] == fresh["digest"]
        for side, run in (("reused", kept), ("not reused", fresh)):
            print(f"  {label} round {r} {side:>10}: user {run['user']:6.1f} s, system "
                  f"{run['sys']:6.1f} s, {run['faults']:>9,} page faults, peak resident "
                  f"{run['peak_gib']:.2f} GiB")  # fmt: skip
    print(f"{label}: CPU reused / not reused, paired median {statistics.median(ratios):.3f};"
          f" outputs identical: {same}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--verifiers", nargs="*", default=["crown", "alpha-crown"])
    parser.add_argument("--attacks", nargs="*", default=["pgd-linf"])
    parser.add_argument("--chunks", nargs="+", type=int, default=[128, 1000])
    parser.add_argument("--data-dir", type=Path, help="default: shared/data/mnist")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    data_dir = args.data_dir or shared_data("mnist")
    if args.child:
        kind, name, chunk = args.child
        child(kind, name, int(chunk), data_dir)
        return
    print("one thread, a fresh process per measurement")
    cases = [("verifier", name, 0) for name in args.verifiers]
    cases += [("attack", name, chunk) for name in args.attacks for chunk in args.chunks]
    for case in cases:
        report(case, data_dir, args.rounds)


if __name__ == "__main__":
    main()
