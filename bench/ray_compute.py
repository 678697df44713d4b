"""Is attack compute slower inside a Ray worker than in a plain process? (docs/scale-out.md)

    python bench/ray_compute.py              # 6 rounds, about 3 min on an idle core
    python bench/ray_compute.py --rounds 10

The same one-thread torch loop, PGD's forward + backward on the zoo's mnist-cnn (250 MNIST
images, 40 steps: the attack of bench/scale_out.py's units), timed in interleaved, paired
rounds: (A) in this process with no Ray running, then, with a private 1-CPU Ray instance
started, in a shuffled order (B) in this process while the idle Ray processes run beside
it and (C) inside a Ray task on a worker that has run the loop once already, and after
Ray's shutdown (A') in this process again. B and C are compared with the mean of the A and
A' around them (a drift of the machine's speed during the round cancels). Printed: the wall
and CPU-time ratios of each round and their medians, A'/A (the same code in the same
process, measured twice: this machine's own noise) and the load average.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"


def pgd_compute(steps: int = 40) -> tuple[float, float]:
    """Wall and CPU seconds of ``steps`` forward + backward passes of PGD (one torch thread)."""
    import torch

    from aisafety.database.datasets.embedded import EmbeddedMnist
    from aisafety.database.zoo import load_zoo_model

    torch.set_num_threads(1)
    network = load_zoo_model("mnist-cnn").network
    data = EmbeddedMnist().load(None, "test")
    x, y = data.x[:250].clone(), data.y[:250]
    started, cpu = time.perf_counter(), time.process_time()
    adversarial = x.clone()
    for _ in range(steps):
        adversarial.requires_grad_(True)
        loss = torch.nn.functional.cross_entropy(network(adversarial), y)
        (grad,) = torch.autograd.grad(loss, adversarial)
        step = adversarial.detach() + 0.01 * grad.sign()
        adversarial = (x + (step - x).clamp(-0.1, 0.1)).clamp(0, 1)
    return time.perf_counter() - started, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    import ray

    loads = [os.getloadavg()[0]]
    print(f"load average {loads[0]:.1f} at the start", flush=True)
    pgd_compute()  # warm: imports, the model file in the page cache
    runs: dict[str, list[tuple[float, float]]] = {"A": [], "B": [], "C": [], "A'": []}
    for round_ in range(args.rounds):
        runs["A"].append(pgd_compute())
        ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        try:
            remote = ray.remote(num_cpus=1)(pgd_compute)
            ray.get(remote.remote())  # the worker process started and warm
            order = ["B", "C"]
            random.Random(round_).shuffle(order)
            for kind in order:
                runs[kind].append(pgd_compute() if kind == "B" else ray.get(remote.remote()))
        finally:
            ray.shutdown()
        runs["A'"].append(pgd_compute())
        loads.append(os.getloadavg()[0])
        print(f"round {round_ + 1}: " + ", ".join(
            f"{k} {v[-1][0]:.2f} s" for k, v in runs.items()
        ) + f" (load {loads[-1]:.1f})", flush=True)  # fmt: skip

    def ratios(kind: str, which: int) -> list[float]:
        if kind == "A'":
            return [b[which] / a[which] for a, b in zip(runs["A"], runs["A'"], strict=True)]
        around = [(a[which] + a2[which]) / 2 for a, a2 in zip(runs["A"], runs["A'"], strict=True)]
        return [b[which] / a for a, b in zip(around, runs[kind], strict=True)]

    for kind, what in (
        ("B", "plain process, idle Ray beside it"),
        ("C", "inside a Ray task"),
        ("A'", "plain process again, after Ray: noise"),
    ):
        base = "A" if kind == "A'" else "(A+A')/2"
        for which, name in ((0, "wall"), (1, "CPU")):
            values = ratios(kind, which)
            print(f"{kind}/{base} {name:4s} ({what}): median {statistics.median(values):.3f} "
                  f"(rounds: {', '.join(f'{v:.3f}' for v in values)})")  # fmt: skip
    plain = [a[0] for a in runs["A"] + runs["A'"]]
    print(f"plain-process runs (A, A'): {min(plain):.2f}-{max(plain):.2f} s, "
          f"spread {max(plain) / min(plain) - 1:.1%}")  # fmt: skip
    print(f"load average {min(loads):.1f}-{max(loads):.1f} (1-minute, at each round's end); "
          f"{os.cpu_count()} cores")  # fmt: skip


if __name__ == "__main__":
    main()
