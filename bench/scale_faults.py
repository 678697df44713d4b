"""Where a capability's time per image goes as the batch grows: user and kernel CPU time and
minor page faults per image, and the chunk sizes the memory budget chose (docs/scale.md,
"Linearity": why PGD-10 and IBP read 1.13 and 1.41 from 16 to 256 images at 224x224).

    OMP_NUM_THREADS=1 nice -n 5 python bench/scale_faults.py --jobs ibp pgd-10 fwd+bwd \
        --sizes 16 256 [--rounds 1] [--memory-gib 6] [--side 224]

The capabilities are ``bench/scale.py``'s, on its ``small-resnet``; each size is called in
turn, round after round, all in one ``reuse_freed_memory`` block as ``scale.py`` times them,
after one uncounted round. Medians over the counted rounds.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import scale  # noqa: E402

from aisafety.attack.base import Attack  # noqa: E402
from aisafety.memory import reuse_freed_memory  # noqa: E402
from aisafety.memory_budget import GIB, memory_limit  # noqa: E402
from aisafety.verification.base import Verifier  # noqa: E402

CHUNKS: list[int] = []  # the chunk sizes chosen in the current call


def record_chunks() -> None:
    """Note every chunk size the attacks and verifiers choose under the budget."""
    attack_chunk, verifier_batch = Attack._budget_chunk, Verifier.fitting_batch

    def attack(self, predictor, size):
        CHUNKS.append(attack_chunk(self, predictor, size))
        return CHUNKS[-1]

    def verifier(self, graph, prop, limit):
        CHUNKS.append(verifier_batch(self, graph, prop, limit))
        return CHUNKS[-1]

    Attack._budget_chunk, Verifier.fitting_batch = attack, verifier


def usage() -> tuple[float, float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime, r.ru_minflt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", nargs="+", default=["fwd+bwd", "pgd-10", "ibp"])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 256])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--side", type=int, default=224)
    parser.add_argument("--memory-gib", type=float, help="a fixed budget (default: a share "
                        "of the memory available at each call)")  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    record_chunks()
    jobs, model = scale.jobs("small-resnet", args.side)
    x, y = scale.data(model, max(args.sizes))
    found: dict[tuple[str, int], list[tuple[float, float, float, list[int]]]] = {}
    budget = memory_limit(int(args.memory_gib * GIB)) if args.memory_gib else nullcontext()
    print(f"CPU: {scale.cpu_model()}; load before {os.getloadavg()[0]:.1f}")
    with reuse_freed_memory(), budget:
        for round_ in range(args.rounds + 1):  # the first round only faults the pages in
            for name in args.jobs:
                for n in args.sizes:
                    CHUNKS.clear()
                    u0, s0, f0 = usage()
                    jobs[name](x[:n], y[:n])
                    u1, s1, f1 = usage()
                    if round_:
                        row = ((u1 - u0) / n, (s1 - s0) / n, (f1 - f0) / n, list(CHUNKS))
                        found.setdefault((name, n), []).append(row)
    print(f"load after {os.getloadavg()[0]:.1f}; {args.rounds} rounds, small-resnet-{args.side}")
    print("| capability | images | user ms/image | kernel ms/image | minor faults/image | chunks |")
    print("|---|---|---|---|---|---|")
    for (name, n), rows in found.items():
        user, kernel, faults = (statistics.median(r[i] for r in rows) for i in range(3))
        print(f"| {name} | {n} | {user * 1e3:.1f} | {kernel * 1e3:.2f} | {faults:.0f} "
              f"| {rows[-1][3] or 'fixed 128'} |")  # fmt: skip


if __name__ == "__main__":
    main()
