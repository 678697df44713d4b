"""PGD-40 at the sizes users run, against torchattacks and the device's floor, per precision.

    python bench/gpu_speed.py [--device cuda] [--nets wrn-28-10 resnet-50] [--rounds 3]
                              [--batch wrn-28-10=256 resnet-50=64] [--steps 40] [--smoke]

For each network shape (random weights, ``testkit/shapes.py``: the time of a pass does not
depend on the weights' values) and a batch of random images, it times in turn, round after
round (A B C ... A B C ...: whatever else the device does falls on all alike):

- floor: ``steps`` x (forward + backward with an input gradient) of the bare network, the
  batch moved into the eps-ball: what any PGD-``steps`` must spend;
- ours: ``pgd-linf`` (``steps`` steps), the clean logits handed over as in an evaluation;
- torchattacks: ``torchattacks.PGD`` with the same eps, step and steps (random start);

each in strict fp32 (TF32 off for matrix products and convolutions), TF32 (on for both),
bf16 (autocast; ours with ``precision: bf16``) and bf16 with channels-last weights and
inputs. Times are wall seconds around synchronised device work. Ratios are paired medians
over rounds. Then, on a trained zoo model (``--accuracy-model``, the embedded 1,000 MNIST
test images), the robust accuracy of our PGD-40 in each precision, which must agree within
0.5 points for a reduced precision to count as a speed-up.

Targets (issue 32): ours <= 1.05x the fp32 floor; ours faster than torchattacks; a reduced
precision >= 2x faster than fp32 at +-0.5 points of robust accuracy.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from shapes import build  # noqa: E402

from aisafety.attack.pgd import PGDLinf  # noqa: E402
from aisafety.prediction.torch_module import TorchPredictor  # noqa: E402

EPS = 8 / 255
PRECISIONS = ("fp32", "tf32", "bf16", "bf16-cl")


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """TF32 for CUDA matrix products and convolutions on or off, restored afterwards."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(run: Callable[[], object], device: torch.device) -> float:
    synchronize(device)
    started = time.perf_counter()
    run()
    synchronize(device)
    return time.perf_counter() - started


def floor(network, x, y, steps: int, dtype) -> None:
    """``steps`` forward + backward passes with an input gradient, nothing else."""
    for _ in range(steps):
        xg = x.detach().requires_grad_(True)
        with torch.autocast(x.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            logits = network(xg)
        loss = F.cross_entropy(logits.float(), y, reduction="sum")
        torch.autograd.grad(loss, xg)


def variants(name: str, batch: int, device: torch.device, steps: int) -> dict[str, Callable]:
    """The runs to time for one network: floor, ours and torchattacks per precision."""
    import torchattacks

    module, shape, classes = build(name)
    plain = TorchPredictor(module, shape, classes, name=name, device=device)
    channels_last = TorchPredictor(
        build(name)[0].to(memory_format=torch.channels_last), shape, classes, device=device
    )
    generator = torch.Generator(device="cpu").manual_seed(0)
    x = torch.rand((batch, *shape), generator=generator).to(device)
    with torch.no_grad():
        y = plain.network(x).argmax(1)
        clean = plain.network(x)
    start = (x + EPS * (2 * torch.rand(x.shape, generator=generator).to(device) - 1)).clamp(0, 1)
    x_cl, start_cl = (t.contiguous(memory_format=torch.channels_last) for t in (x, start))
    alpha = EPS / 4
    ours = {p: PGDLinf(steps=steps, step_size=alpha, precision=p) for p in ("fp32", "bf16")}
    theirs = torchattacks.PGD(plain.network, eps=EPS, alpha=alpha, steps=steps)

    def on(enabled: bool, run: Callable[[], object]) -> Callable[[], object]:
        def wrapped() -> object:
            with tf32(enabled):
                return run()

        return wrapped

    bf16 = torch.bfloat16
    return {
        "floor fp32": on(False, lambda: floor(plain.network, start, y, steps, None)),
        "floor tf32": on(True, lambda: floor(plain.network, start, y, steps, None)),
        "floor bf16": on(False, lambda: floor(plain.network, start, y, steps, bf16)),
        "floor bf16-cl": on(False, lambda: floor(channels_last.network, start_cl, y, steps, bf16)),
        "ours fp32": on(False, lambda: ours["fp32"](plain, x, y, EPS, clean_logits=clean)),
        "ours tf32": on(True, lambda: ours["fp32"](plain, x, y, EPS, clean_logits=clean)),
        "ours bf16": on(False, lambda: ours["bf16"](plain, x, y, EPS, clean_logits=clean)),
        "ours bf16-cl": on(
            False, lambda: ours["bf16"](channels_last, x_cl, y, EPS, clean_logits=clean)
        ),
        "torchattacks fp32": on(False, lambda: theirs(x, y)),
    }


def paired(times: dict[str, list[float]], a: str, b: str) -> float:
    return statistics.median(t / r for t, r in zip(times[a], times[b], strict=True))


def time_net(name: str, batch: int, device: torch.device, steps: int, rounds: int) -> None:
    runs = variants(name, batch, device, steps)
    for run in runs.values():  # warm-up: kernels, autotuning, allocator
        run()
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(rounds):
        for key, run in runs.items():
            times[key].append(timed(run, device))
    print(f"\n== {name}, batch {batch}, PGD-{steps} l-inf {EPS:.4f}, {rounds} rounds, {device}")
    print(f"{'':20} {'median s':>9} {'images/s':>9} {'x ours fp32':>12} {'x its floor':>12}")
    for key, values in times.items():
        precision = key.split()[-1]
        own_floor = f"floor {precision}"
        versus = f"{paired(times, key, own_floor):12.3f}" if own_floor != key else f"{'':12}"
        print(f"{key:20} {statistics.median(values):9.3f} {batch / statistics.median(values):9.1f}"
              f" {paired(times, key, 'ours fp32'):12.3f} {versus}")  # fmt: skip
    reduced = ("tf32", "bf16", "bf16-cl")
    fastest = min(reduced, key=lambda p: paired(times, f"ours {p}", "ours fp32"))
    print(f"TARGET ours fp32 <= 1.05x fp32 floor: {paired(times, 'ours fp32', 'floor fp32'):.3f}")
    print(f"TARGET ours faster than torchattacks (fp32): ours/torchattacks "
          f"{paired(times, 'ours fp32', 'torchattacks fp32'):.3f}")  # fmt: skip
    print(
        f"TARGET reduced precision >= 2x fp32: best is {fastest}, "
        f"{1 / paired(times, f'ours {fastest}', 'ours fp32'):.2f}x (accuracy: see below)"
    )


def accuracy(model: str, device: torch.device, steps: int, limit: int) -> None:
    """Robust accuracy of our PGD on a trained zoo model in each precision."""
    from aisafety.database.datasets.embedded import EmbeddedMnist
    from aisafety.database.zoo import load_zoo_model

    predictor = load_zoo_model(model, device=device)
    data = EmbeddedMnist().load(None, "test")
    x, y = data.x[:limit].to(device), data.y[:limit].to(device)
    found = {}
    for precision in ("fp32", "tf32", "bf16"):
        search = "fp32" if precision == "tf32" else precision
        attack = PGDLinf(steps=steps, step_size=0.01, precision=search)
        with tf32(precision == "tf32"):
            found[precision] = attack(predictor, x, y, 0.3).robust_accuracy
    print(f"\n== robust accuracy of PGD-{steps} at l-inf 0.3, {model}, {len(x)} images, {device}: "
          + ", ".join(f"{p} {a:.4f}" for p, a in found.items()))  # fmt: skip
    gap = max(abs(a - found["fp32"]) for a in found.values())
    print(
        f"TARGET reduced precisions within 0.005 of fp32: largest gap {gap:.4f} "
        f"({'met' if gap <= 0.005 else 'MISSED'})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--nets", nargs="+", default=["wrn-28-10", "resnet-50"])
    parser.add_argument("--batch", nargs="+", default=["wrn-28-10=256", "resnet-50=64"])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--accuracy-model", default="mnist-cnn-pgd-at")
    parser.add_argument("--accuracy-images", type=int, default=1000)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script runs")
    args = parser.parse_args()
    device = torch.device(args.device)
    batches = {k: int(v) for k, v in (item.split("=") for item in args.batch)}
    if args.smoke:
        batches, args.steps, args.rounds, args.accuracy_images = dict.fromkeys(batches, 2), 2, 1, 32
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"torch {torch.__version__}, device {device} ({name})")
    for net in args.nets:
        time_net(net, batches[net], device, args.steps, args.rounds)
    accuracy(args.accuracy_model, device, args.steps, args.accuracy_images)


if __name__ == "__main__":
    main()
