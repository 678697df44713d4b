"""PGD-40 in bf16 against fp32 on this machine's CPU, with both floors, in one run.

    python bench/precision.py [--batches 128 512] [--repeats 3] [--threads N] [--model NAME]
                              [--steps 40]

For each batch size, on the zoo model (default ``mnist-cnn-pgd-at``, whose robust accuracy
at eps 0.3 is far from 0 and 1, so a weaker bf16 search would show) and the embedded MNIST
test images, times in turn (A B C D A B C D ...: load from other work falls on all alike):

- fp32 floor: 40 x (forward + backward with an input gradient), fp32, the batch moved into
  the eps-ball (what any PGD-40 must spend; as in ``bench/attacks.py``);
- bf16 floor: the same passes under ``torch.autocast(dtype=bfloat16)`` (logits cast back to
  fp32 for the loss, as ``aisafety.attack.precision.ReducedPrecision`` does);
- ours in fp32: ``pgd-linf`` (steps 40, step 0.01), the clean logits handed over as in an
  evaluation;
- ours in bf16: the same with ``precision: bf16``.

It prints images/s, the paired median (over rounds) of each time against ours in fp32, the
robust accuracy of both, and the load average before and after. Target (issue 16): ours in
bf16 at least 2x faster than ours in fp32, robust accuracy within 0.5 points.

A CPU without AVX512-BF16 or AMX-BF16 refuses ``precision: bf16`` (it would run slower
than fp32); the bench then forces it, to show by how much, and says so. There a bf16 run
takes many times as long as an fp32 one: ``--steps`` shortens every run alike (floors
included, so the ratios are per step; the robust accuracies are then those of fewer steps).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from unittest import mock

import torch
import torch.nn.functional as F

import aisafety.attack.precision as precision
from aisafety.attack.pgd import PGDLinf
from aisafety.database.datasets.embedded import EmbeddedMnist
from aisafety.database.zoo import load_zoo_model

EPS, ALPHA = 0.3, 0.01


def floor(network: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, dtype, steps: int) -> None:
    """``steps`` forward + backward passes with an input gradient, nothing else."""
    for _ in range(steps):
        xg = x.detach().requires_grad_(True)
        if dtype is None:
            logits = network(xg)
        else:
            with torch.autocast("cpu", dtype=dtype):
                logits = network(xg)
        loss = F.cross_entropy(logits.float(), y, reduction="sum")
        torch.autograd.grad(loss, xg)


def in_ball(x: torch.Tensor) -> torch.Tensor:
    noise = torch.rand(x.shape, generator=torch.Generator().manual_seed(0))
    return (x + (2 * noise - 1) * EPS).clamp(0, 1)


def interleaved(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - started)
    return times


def one_batch(predictor, x: torch.Tensor, y: torch.Tensor, repeats: int, steps: int) -> None:
    network, n = predictor.network, len(x)
    start = in_ball(x)
    with torch.inference_mode():
        clean = predictor.logits(x)
    ours = {
        "fp32": PGDLinf(steps=steps, step_size=ALPHA),
        "bf16": PGDLinf(steps=steps, step_size=ALPHA, precision="bf16"),
    }
    runs = {
        "fp32 floor": lambda: floor(network, start, y, None, steps),
        "bf16 floor": lambda: floor(network, start, y, torch.bfloat16, steps),
        "ours fp32": lambda: ours["fp32"](predictor, x, y, EPS, clean_logits=clean),
        "ours bf16": lambda: ours["bf16"](predictor, x, y, EPS, clean_logits=clean),
    }
    floor(network, start[:8], y[:8], torch.bfloat16, steps=2)  # warm-up: oneDNN kernels
    floor(network, start[:8], y[:8], None, steps=2)
    load = os.getloadavg()[0]
    times = interleaved(runs, repeats)
    load_after = os.getloadavg()[0]
    accuracy = {
        k: attack(predictor, x, y, EPS, clean_logits=clean).robust_accuracy
        for k, attack in ours.items()
    }
    reference = times["ours fp32"]
    print(f"\n== PGD-{steps} l-inf eps={EPS} step={ALPHA}, batch {n}, {repeats} rounds, "
          f"load average {load:.1f} before, {load_after:.1f} after")  # fmt: skip
    print(f"{'':12} {'images/s':>9} {'x ours fp32':>12} {'robust acc':>10}")
    for name, values in times.items():
        ratio = statistics.median(t / r for t, r in zip(values, reference, strict=True))
        acc = accuracy.get(name.removeprefix("ours ")) if name.startswith("ours") else None
        shown = "" if acc is None else f"{acc:.3f}"
        print(f"{name:12} {n / statistics.median(values):9.1f} {ratio:12.3f} {shown:>10}")

    def paired(a: str, b: str) -> float:
        return statistics.median(t / r for t, r in zip(times[a], times[b], strict=True))

    speedup = paired("ours fp32", "ours bf16")
    gap = abs(accuracy["bf16"] - accuracy["fp32"])
    print(f"bf16 floor / fp32 floor: {paired('bf16 floor', 'fp32 floor'):.2f}; "
          f"ours bf16 / bf16 floor: {paired('ours bf16', 'bf16 floor'):.3f}; "
          f"ours fp32 / fp32 floor: {paired('ours fp32', 'fp32 floor'):.3f}")  # fmt: skip
    verdict = "met" if speedup >= 2 and gap <= 0.005 else "MISSED"
    print(f"TARGET ours fp32 / ours bf16 >= 2 with robust accuracy within 0.005: "
          f"{speedup:.2f}x, gap {gap:.3f} ({verdict})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--model", default="mnist-cnn-pgd-at")
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    fast = precision.fast_precisions(cpu)
    flags = precision._cpu_flags()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU "
          f"{flags.get('cpu_name', '?')}: avx512_bf16={flags.get('avx512_bf16')}, "
          f"amx_bf16={flags.get('amx_bf16')}, fast reduced precisions: "
          f"{', '.join(fast) or 'none'}")  # fmt: skip
    kernel = precision.kernel_cpu_flags()
    shown = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
    auto = precision.compute_dtype("auto", cpu, "bench") or "fp32"
    print("kernel's CPU flags (/proc/cpuinfo): "
          + ", ".join(f"{flag}={'yes' if flag in kernel else 'no'}" for flag in shown)
          + f"; precision: auto picks {auto}")  # fmt: skip
    if "bf16" not in fast:
        print("This CPU has no fast bf16, so `precision: bf16` is refused here; the bench "
              "forces it to measure what it would cost. The 2x target cannot be met on this "
              "hardware (bf16 is emulated): see the bf16 floor against the fp32 one.")  # fmt: skip
    predictor = load_zoo_model(args.model)
    data = EmbeddedMnist().load(None, "test")
    print(f"model {args.model}, embedded MNIST test images")
    with mock.patch.object(precision, "fast_precisions", lambda device: ("bf16",)):
        for batch in args.batches:
            one_batch(predictor, data.x[:batch], data.y[:batch], args.repeats, args.steps)


if __name__ == "__main__":
    main()
