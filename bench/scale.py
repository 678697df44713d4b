"""Time and peak memory per capability at 28x28x1, 32x32x3 and 224x224x3, as ratios to one
forward and backward pass of the bare model, and how time grows with the number of images.

    OMP_NUM_THREADS=1 nice -n 15 python bench/scale.py [--images 64] [--rounds 3]
        [--shape small-resnet-32] [--only ratios|linearity] [--linear 64 1024] [--skip crown]

Small random-weight nets (``testkit/shapes.py``: ``small-cnn`` at 1x28x28, ``small-resnet``
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
capability's CPU seconds on 1, ``small`` and ``large`` images, in turn, per round, all
inside one ``reuse_freed_memory`` block after an uncounted first round. The kernel's time
is mostly page faults on the first touch of a call's fresh buffers, a cost per call that
grows with the largest chunk (128 images), not with the images: measured on
``small-resnet`` at 32x32, one forward-backward pass faults 140 pages per image on 64
images (0.32 ms of kernel time per image, more than its 0.27 ms of user time) and 18 per
image on 1,024 (0.03 ms). In one block the heap keeps the freed pages, so after the first
round a call faults in little. (User-mode time alone, used before, is no measure for a
call of a few ms: Linux splits a process's CPU time into user and system by sampling at
the timer tick and holds the split monotonic, so a 20 ms call can read 0 or twice its
user time.) The raw
The raw
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

The images are random and labelled with the model's own predictions, so every capability
works on every image. Square (the only capability here whose work depends on the data: it
stops querying a fooled image and skips a misclassified one) must then spend its full 100
queries on every image; the bench counts the images that stopped early and prints it (0
is what makes its linearity a measurement of the number of images; random labels left 90%
of the images unattacked on a random net, a share that differed from call to call: that
was Square's 0.40).

Capabilities: the forward pass every metric makes, FGSM, PGD-10, Square (100 queries), the
Gaussian-noise corruption, smoothing certification (n = 20 noisy images per image), neuron
outputs (coverage's pass), IBP, CROWN-IBP, and CROWN (not at 224x224: its first intermediate
bound has 400,000 neurons there, docs/certification.md).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
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
from aisafety.memory_budget import GIB, fitting, memory_limit  # noqa: E402
from aisafety.prediction.footprint import image_bytes  # noqa: E402
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
QUERIES = 100  # Square's budget per image
SHORT = [0, 0]  # images on which Square stopped before QUERIES, images Square ran on
PEAK: dict[str, int] = {}  # per capability: the highest peak resident size of its calls
SHAPES = {"small-cnn-28": ("small-cnn", 28), "small-resnet-32": ("small-resnet", 32),
          "small-resnet-224": ("small-resnet", 224)}  # fmt: skip
Job = Callable[[torch.Tensor, torch.Tensor], object]


def jobs(name: str, side: int) -> tuple[dict[str, Job], TorchPredictor]:
    """Each capability as a call on (images, labels), on one model of this shape; and the
    model (its predictions are the labels, ``data``)."""
    net, shape, classes = build(name, side=side)
    model = TorchPredictor(net, shape, classes, name=f"{name}-{side}")
    layers = default_layers(model)
    graph = build_graph(net, shape, model.name, dtype=torch.float32)

    def verify(verifier):
        return lambda x, y: verifier.verify(graph, robustness_property(x, y, EPS, classes))

    out: dict[str, Job] = {
        "fwd+bwd": lambda x, y: floor(net, model, x, y),
        "forward": lambda x, y: batched_logits(model, x, 128),
        "fgsm": lambda x, y: FGSM()(model, x, y, EPS),
        "pgd-10": lambda x, y: PGDLinf(steps=10)(model, x, y, EPS),
        f"square-{QUERIES}": lambda x, y: square(model, x, y),
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
    return out, model


def square(model: TorchPredictor, x: torch.Tensor, y: torch.Tensor) -> None:
    """Square with its full query budget on every image, counted in ``SHORT``: a sample
    fooled (or misclassified) early stops querying, and then its time measures the data,
    not the number of images."""
    result = SquareLinf(queries=QUERIES)(model, x, y, EPS)
    SHORT[0] += int((result.steps < QUERIES).sum())
    SHORT[1] += len(y)


def floor(net: torch.nn.Module, model: TorchPredictor, x: torch.Tensor, y: torch.Tensor) -> None:
    """One forward and backward pass with an input gradient, in chunks of 128 as the attacks
    (fewer where the memory budget asks: 128 images at 224x224 took 3.3 GB)."""
    size = fitting("the floor", image_bytes(model, True), 128, "raise --memory-gib")
    for xc, yc in zip(x.split(size), y.split(size), strict=True):
        xg = xc.detach().requires_grad_(True)
        torch.autograd.grad(F.cross_entropy(net(xg), yc, reduction="sum"), xg)


def measure(job: Job, x: torch.Tensor, y: torch.Tensor) -> tuple[float, int]:
    """CPU seconds (the process's, one thread) and peak resident growth of one call."""
    reset_peak_rss()  # the peak resident size (VmHWM) := the current one
    before = status_bytes("VmRSS")
    started = time.process_time()
    with reuse_freed_memory():
        job(x, y)
    peak = max(1, status_bytes("VmHWM") - before)
    return time.process_time() - started, peak


def data(model: TorchPredictor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` random images, labelled with the model's own predictions: every image is
    classified correctly, so no capability skips one (an attack leaves a misclassified
    image alone; with random labels a random net gets about 90% wrong, a number that
    differs between the 1-, small- and large-image calls)."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, *model.input_shape, generator=g)
    return x, batched_logits(model, x, 128).argmax(1)


def ratios(
    name: str, side: int, n: int, rounds: int, skip: tuple[str, ...] = ()
) -> dict[str, tuple[float, float]]:
    """Per capability: (time / fwd+bwd, peak memory / fwd+bwd's), paired over rounds."""
    every, model = jobs(name, side)
    table = {k: v for k, v in every.items() if k not in skip}
    x, y = data(model, n)
    times: dict[str, list[float]] = {k: [] for k in table}
    peaks: dict[str, list[int]] = {k: [] for k in table}
    for job in table.values():  # warm-up, not counted: first-call costs, the memory probe
        measure(job, x[:2], y[:2])
    for _ in range(rounds):
        for key, job in table.items():
            seconds, peak = measure(job, x, y)
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
    every, model = jobs(name, side)
    table = {k: v for k, v in every.items() if k not in skip}
    x, y = data(model, large)
    out: dict[str, list[tuple[float, float, float]]] = {k: [] for k in table}
    with reuse_freed_memory():  # one block: a call reuses the heap pages of the calls before
        for round_ in range(rounds + 1):  # the first round only faults the pages in
            for key, job in table.items():
                t1, ts, tl = (measure(job, x[:n], y[:n])[0] for n in (1, small, large))
                PEAK[key] = max(PEAK.get(key, 0), status_bytes("VmHWM"))
                fixed = t1 - (tl - ts) / (large - small)
                if round_:
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
    print_square()
    keys = list(dict.fromkeys(k for r in results for k in r))
    print(f"\n{images} images, {rounds} rounds; CPU time / peak memory as ratios to fwd+bwd")
    print("| capability | " + " | ".join(shapes) + " |")
    print("|---" * (len(shapes) + 1) + "|")
    for key in keys:
        cells = [f"{r[key][0]:.2f}x / {r[key][1]:.2f}x" if key in r else "not run" for r in results]
        print(f"| {key} | " + " | ".join(cells) + " |")


def print_linearity(shape: str, small: int, large: int, rounds: int, skip: tuple[str, ...]) -> None:
    SHORT[:] = [0, 0]
    lin = linearity(*SHAPES[shape], small, large, rounds, skip)
    print(f"\nlinearity, {shape}: per-image CPU time on {large} images / on {small}, "
          f"{rounds} rounds (target 0.9-1.1)")  # fmt: skip
    print("| capability | raw ratio | fixed cost per call | ratio, fixed cost discounted | ok "
          "| discounted ratio / fwd+bwd's | peak RSS |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    floor = lin["fwd+bwd"][2]
    for key, (raw, fixed, discounted) in lin.items():
        ok = "yes" if 0.9 <= discounted <= 1.1 else "no"
        print(f"| {key} | {raw:.2f} | {fixed * 1e3:.1f} ms | {discounted:.2f} | {ok} "
              f"| {discounted / floor:.2f} | {PEAK[key] / GIB:.2f} GiB |", flush=True)  # fmt: skip
    print_square()


def print_square() -> None:
    """How many of Square's images stopped before the budget (0: a fixed number of queries)."""
    if SHORT[1]:
        print(f"square-{QUERIES}: {SHORT[0]} of {SHORT[1]} images (all calls) stopped before "
              f"{QUERIES} queries", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
