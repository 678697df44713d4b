"""Time and peak memory per capability at 28x28x1, 32x32x3 and 224x224x3, as ratios to one
forward and backward pass of the bare model, and how time grows with the number of images.

    OMP_NUM_THREADS=1 nice -n 15 python bench/scale.py [--images 64] [--rounds 3]
        [--shape small-resnet-32] [--only ratios|linearity] [--linear 64 1024] [--skip crown]

Small random-weight nets (``bench/shapes.py``: ``small-cnn`` at 1x28x28, ``small-resnet``
at 3x32x32 and 3x224x224), so the whole bench runs in minutes on one CPU thread; the ratios
say what a capability costs in model passes, which carries over to a larger net of the same
input size. For each shape, round after round (the capabilities in turn, then again: what
else the machine does falls on all alike), each capability runs on the same ``--images``
random images and is timed against the forward-and-backward pass of the same batch in the
same round, after one uncounted warm-up call; the time ratio is the paired median over
rounds. Times are the process's CPU time (one thread: what a busy machine's other jobs do
not inflate, unlike wall time). Its peak memory is the growth of the peak resident size
over the resident size before it (the peak is reset through ``/proc/self/clear_refs``
first), as a ratio to the pass's own growth.

Linearity (issue 32: the per-image time from 64 to 1,024 images stays within 10%): each
capability's user-mode CPU seconds on 1, ``small`` and ``large`` images, in turn, per round.
User mode, because the kernel's time is mostly page faults on the first touch of a call's
fresh buffers, a cost per call that grows with the largest chunk (128 images), not with the
images: measured on ``small-resnet`` at 32x32, one forward-backward pass faults 140 pages
per image on 64 images (0.32 ms of kernel time per image, more than its 0.27 ms of user
time) and 18 per image on 1,024 (0.03 ms). The raw
ratio is the per-image time on ``large`` over that on ``small``. A call also has a cost that
does not grow with its images (Python, autograd and graph set-up, the memory probe), which on
a small net dominates 64 images and makes the raw ratio sub-linear. So the check discounts it:
the fixed cost is the 1-image call less one image's marginal cost,
``c = t(1) - (t(large) - t(small)) / (large - small)``, and the discounted ratio is
``((t(large) - c) / large) / ((t(small) - c) / small)``: exactly 1 when ``t(n) = c + r n``,
above 1 when the time grows faster than linearly. Medians over rounds. The bare model's own
pass is not linear on a CPU (a batch that leaves the cache costs more per image, a small one
fills the vector units less), so the last column divides by the pass's discounted ratio: a
capability whose cost stays a fixed number of model passes reads 1 there.

Capabilities: the forward pass every metric makes, FGSM, PGD-10, Square (100 queries), the
Gaussian-noise corruption, smoothing certification (n = 20 noisy images per image), neuron
outputs (coverage's pass), IBP, CROWN-IBP, and CROWN (not at 224x224: its first intermediate
bound has 400,000 neurons there, docs/certification.md).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from shapes import build  # noqa: E402

from aisafety.attack.fgsm import FGSM  # noqa: E402
from aisafety.attack.pgd import PGDLinf  # noqa: E402
from aisafety.attack.square import SquareLinf  # noqa: E402
from aisafety.defense.randomized_smoothing import RandomizedSmoothing  # noqa: E402
from aisafety.defense.smoothing.certify import certify  # noqa: E402
from aisafety.evaluation.corrupted import corrupted_predictions  # noqa: E402
from aisafety.evaluation.inference import batched_logits  # noqa: E402
from aisafety.evaluation.neurons import default_layers, neuron_outputs  # noqa: E402
from aisafety.memory import reuse_freed_memory  # noqa: E402
from aisafety.memory_budget import GIB, memory_limit  # noqa: E402
from aisafety.prediction.torch_module import TorchPredictor  # noqa: E402
from aisafety.unit_cost import reset_peak_rss, status_bytes  # noqa: E402
from aisafety.verification.graph import build_graph  # noqa: E402
from aisafety.verification.incomplete import (  # noqa: E402
    CrownIBPVerifier,
    CrownVerifier,
    IBPVerifier,
)
from aisafety.verification.property import robustness_property  # noqa: E402

EPS = 2 / 255
SHAPES = {"small-cnn-28": ("small-cnn", 28), "small-resnet-32": ("small-resnet", 32),
          "small-resnet-224": ("small-resnet", 224)}  # fmt: skip
Job = Callable[[torch.Tensor, torch.Tensor], object]


def jobs(name: str, side: int) -> dict[str, Job]:
    """Each capability as a call on (images, labels), on one model of this shape."""
    net, shape, classes = build(name, side=side)
    model = TorchPredictor(net, shape, classes, name=f"{name}-{side}")
    layers = default_layers(model)
    graph = build_graph(net, shape, model.name, dtype=torch.float32)

    def verify(verifier):
        return lambda x, y: verifier.verify(graph, robustness_property(x, y, EPS, classes))

    out: dict[str, Job] = {
        "fwd+bwd": lambda x, y: floor(net, x, y),
        "forward": lambda x, y: batched_logits(model, x, 128),
        "fgsm": lambda x, y: FGSM()(model, x, y, EPS),
        "pgd-10": lambda x, y: PGDLinf(steps=10)(model, x, y, EPS),
        "square-100": lambda x, y: SquareLinf(queries=100)(model, x, y, EPS),
        "gaussian_noise": lambda x, y: corrupted_predictions(model, x, "gaussian_noise", 3, 0, 128),
        "smoothing n=20": lambda x, y: certify(
            RandomizedSmoothing(model, batch_size=256), x, n0=10, n=20, alpha=0.001
        ),
        "neuron outputs": lambda x, y: neuron_outputs(model, x, layers, 128),
        "ibp": verify(IBPVerifier()),
        "crown-ibp": verify(CrownIBPVerifier()),
    }
    if side < 224:
        out["crown"] = verify(CrownVerifier())
    return out


def floor(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """One forward and backward pass with an input gradient, in chunks of 128 as the attacks."""
    for xc, yc in zip(x.split(128), y.split(128), strict=True):
        xg = xc.detach().requires_grad_(True)
        torch.autograd.grad(F.cross_entropy(net(xg), yc, reduction="sum"), xg)


def _user() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_utime


def measure(job: Job, x: torch.Tensor, y: torch.Tensor) -> tuple[float, int, float]:
    """CPU seconds (the process's, one thread), peak resident growth and user-mode CPU
    seconds (without the kernel's page faults) of one call."""
    reset_peak_rss()  # the peak resident size (VmHWM) := the current one
    before = status_bytes("VmRSS")
    started, user = time.process_time(), _user()
    with reuse_freed_memory():
        job(x, y)
    peak = max(1, status_bytes("VmHWM") - before)
    return time.process_time() - started, peak, _user() - user


def data(n: int, side: int, channels: int, classes: int = 10) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return torch.rand(n, channels, side, side, generator=g), torch.randint(
        classes, (n,), generator=g
    )


def ratios(
    name: str, side: int, n: int, rounds: int, skip: tuple[str, ...] = ()
) -> dict[str, tuple[float, float]]:
    """Per capability: (time / fwd+bwd, peak memory / fwd+bwd's), paired over rounds."""
    table = {k: v for k, v in jobs(name, side).items() if k not in skip}
    x, y = data(n, side, 1 if side == 28 else 3)
    times: dict[str, list[float]] = {k: [] for k in table}
    peaks: dict[str, list[int]] = {k: [] for k in table}
    for job in table.values():  # warm-up, not counted: first-call costs, the memory probe
        measure(job, x[:2], y[:2])
    for _ in range(rounds):
        for key, job in table.items():
            seconds, peak, _ = measure(job, x, y)
            times[key].append(seconds)
            peaks[key].append(peak)
    base_t, base_m = times["fwd+bwd"], statistics.median(peaks["fwd+bwd"])
    return {
        k: (
            statistics.median(t / b for t, b in zip(times[k], base_t, strict=True)),
            statistics.median(peaks[k]) / base_m,
        )
        for k in table
    }


def linearity(
    name: str, side: int, small: int, large: int, rounds: int, skip: tuple[str, ...] = ()
) -> dict[str, tuple[float, float, float]]:
    """Per capability: the raw per-image time ratio ``large`` / ``small``, the fixed cost
    per call (seconds) and the ratio with that cost discounted (module docstring)."""
    table = {k: v for k, v in jobs(name, side).items() if k not in skip}
    x, y = data(large, side, 1 if side == 28 else 3)
    out: dict[str, list[tuple[float, float, float]]] = {k: [] for k in table}
    for job in table.values():
        measure(job, x[:2], y[:2])
    for _ in range(rounds):
        for key, job in table.items():
            t1, ts, tl = (measure(job, x[:n], y[:n])[2] for n in (1, small, large))
            fixed = t1 - (tl - ts) / (large - small)
            out[key].append((tl / large / (ts / small), fixed,
                             ((tl - fixed) / large) / ((ts - fixed) / small)))  # fmt: skip
    return {k: tuple(statistics.median(r[i] for r in v) for i in range(3)) for k, v in out.items()}


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--linear", type=int, nargs=2, default=(64, 1024))
    parser.add_argument("--shape", choices=list(SHAPES), action="append", help="default: all")
    parser.add_argument("--skip", nargs="*", default=(), help="capabilities left out")
    parser.add_argument("--memory-gib", type=float, help="the memory budget (default: a share "
                        "of the available memory, docs/memory.md)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="8 images, 1 round, 8 vs 32")
    parser.add_argument("--only", choices=("ratios", "linearity"), help="one of the two parts")
    args = parser.parse_args()
    if args.quick:
        args.images, args.rounds, args.linear = 8, 1, (8, 32)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(f"CPU: {cpu_model()}; threads {torch.get_num_threads()}; "
          f"load before: {os.getloadavg()[0]:.1f}")  # fmt: skip
    shapes = args.shape or list(SHAPES)
    skip = tuple(args.skip)
    budget = memory_limit(int(args.memory_gib * GIB)) if args.memory_gib else nullcontext()
    with budget:
        if args.only != "linearity":
            print_ratios(shapes, args.images, args.rounds, skip)
        if args.only != "ratios":
            for shape in shapes:
                print_linearity(shape, *args.linear, args.rounds, skip)
    print(f"\nload after: {os.getloadavg()[0]:.1f}")


def print_ratios(shapes: list[str], images: int, rounds: int, skip: tuple[str, ...]) -> None:
    results = []
    for shape in shapes:
        results.append(ratios(*SHAPES[shape], images, rounds, skip))
        print(f"{shape}:", {k: f"{t:.2f}x/{m:.2f}x" for k, (t, m) in results[-1].items()},
              flush=True)  # fmt: skip
    keys = list(dict.fromkeys(k for r in results for k in r))
    print(f"\n{images} images, {rounds} rounds; CPU time / peak memory as ratios to fwd+bwd")
    print("| capability | " + " | ".join(shapes) + " |")
    print("|---" * (len(shapes) + 1) + "|")
    for key in keys:
        cells = [f"{r[key][0]:.2f}x / {r[key][1]:.2f}x" if key in r else "not run" for r in results]
        print(f"| {key} | " + " | ".join(cells) + " |")


def print_linearity(shape: str, small: int, large: int, rounds: int, skip: tuple[str, ...]) -> None:
    lin = linearity(*SHAPES[shape], small, large, rounds, skip)
    print(f"\nlinearity, {shape}: per-image user CPU time on {large} images / on {small}, "
          f"{rounds} rounds (target 0.9-1.1)")  # fmt: skip
    print("| capability | raw ratio | fixed cost per call | ratio, fixed cost discounted | ok "
          "| discounted ratio / fwd+bwd's |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    floor = lin["fwd+bwd"][2]
    for key, (raw, fixed, discounted) in lin.items():
        ok = "yes" if 0.9 <= discounted <= 1.1 else "no"
        print(f"| {key} | {raw:.2f} | {fixed * 1e3:.1f} ms | {discounted:.2f} | {ok} "
              f"| {discounted / floor:.2f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
