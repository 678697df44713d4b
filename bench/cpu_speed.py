"""PGD-40 on the CPU at the sizes users run: against the floor, torchattacks and per layout.

    python3 bench/cpu_speed.py [--threads N] [--nets wrn-28-10 resnet-50 mnist-cnn]
                               [--batch wrn-28-10=8 resnet-50=2 mnist-cnn=128] [--steps 40]
                               [--rounds 3] [--accuracy-images 1000] [--compile]
                               [--only ROW ...] [--cpu-time] [--profile] [--smoke]

The CPU counterpart of ``bench/gpu_speed.py``. It prints the CPU (model, torch's and the
kernel's AVX512-BF16 / AMX flags, what ``precision: auto`` picks), the threads and the load,
then for each network (random weights, ``testkit/shapes.py``; ``mnist-cnn`` is the zoo's
architecture) and a batch of random images times in turn, round after round (A B C ... A B
C ...: what else the machine does falls on all alike):

- floors: ``steps`` x (forward + backward with an input gradient) of the bare network on the
  batch moved into the eps-ball, then one forward pass (the logits of the last iterate, which
  an evaluation needs), in fp32, fp32 channels-last, bf16 and bf16 channels-last (bf16 rows
  only where the CPU has fast bf16: elsewhere oneDNN emulates it at 7-8x fp32's cost,
  docs/attacks.md); with ``--compile`` also fp32 under ``torch.compile`` (compiled once,
  before the rounds); ``floor fp32 reused``: the fp32 floor with freed memory kept for
  reuse as every attack call does (``aisafety.memory``), so that ours over it is the
  attack's own work and the fp32 floor over it is the allocator's;
- ours: ``pgd-linf`` (``steps`` steps, step eps/4), the clean logits handed over as in an
  evaluation, in fp32 and with ``precision: auto``;
- torchattacks: ``torchattacks.PGD`` with the same eps, step and steps (random start), alone
  and followed by the forward pass on its result that an evaluation needs for its
  predictions (ours ends with that pass, in fp32: the base class's final check).

Times are CPU seconds of the process with one thread (the machine is shared: another
process's work does not count), wall seconds with more (``--cpu-time``: CPU seconds there
too, idle threads' spinning included). Ratios are paired medians over the rounds; each
round's times are printed as it ends. ``--profile`` times nothing: it prints the aten calls
and self-CPU per step of ours and torchattacks (torch.profiler, each profiled at 1 and 3
steps, per step is the difference) and what a call costs besides its steps. Then the
robust accuracy of our PGD on the zoo's ``mnist-cnn-pgd-at`` (the embedded 1,000 MNIST test
images, l-inf 0.3) in fp32 and ``auto``, which must agree within 0.5 points.

Targets (issue 32): ours fp32 <= 1.05x the fp32 floor and faster than torchattacks; with
``precision: auto`` on a CPU with AMX >= 2x faster than fp32 within 0.5 points.
``--smoke`` (batch 1, 2 steps, 1 round, 32 images) checks the script: 8 CPU s (under a
minute of wall time unless the machine is loaded).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from shapes import build  # noqa: E402

import aisafety.attack.precision as precision  # noqa: E402
from aisafety.attack.pgd import PGDLinf  # noqa: E402
from aisafety.database.architectures import build as build_architecture  # noqa: E402
from aisafety.memory import reuse_freed_memory  # noqa: E402
from aisafety.prediction.torch_module import TorchPredictor  # noqa: E402

EPS = 8 / 255
CL = torch.channels_last
Run = Callable[[int], object]  # a run of that many steps


def cpu_line() -> str:
    """The CPU's model, the bf16 flags as torch and the kernel see them, what auto picks."""
    flags, kernel = precision._cpu_flags(), precision.kernel_cpu_flags()
    model = next(
        (line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")),
        flags.get("cpu_name", "?"),
    )
    auto = precision.compute_dtype("auto", torch.device("cpu"), "bench") or "fp32"
    shown = ", ".join(
        f"{f}: torch {bool(flags.get(f))}, kernel {f in kernel}"
        for f in ("avx512_bf16", "amx_bf16")
    )
    return f"CPU {model} ({os.cpu_count()} logical); {shown}; precision: auto picks {auto}"


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def network(name: str) -> tuple[torch.nn.Module, tuple[int, int, int], int]:
    if name == "mnist-cnn":
        torch.manual_seed(0)
        return build_architecture("mnist-cnn").eval(), (1, 28, 28), 10
    return build(name)


def floor(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, dtype) -> None:
    """``steps`` forward + backward passes with an input gradient, then the one forward pass
    whose logits an evaluation needs (PGD-40's predictions are those of its 40th iterate),
    nothing else."""
    autocast = torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None)
    for _ in range(steps):
        xg = x.detach().requires_grad_(True)
        with autocast:
            logits = net(xg)
        loss = F.cross_entropy(logits.float(), y, reduction="sum")
        torch.autograd.grad(loss, xg)
    with torch.inference_mode(), autocast:
        net(x)


def floor_reused(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> None:
    """The fp32 floor with freed memory kept for reuse, as in every attack call
    (``aisafety.memory``): what is left of ours over it is the attack's own work."""
    with reuse_freed_memory():
        floor(net, x, y, steps, None)


def variants(name: str, batch: int, compiled: bool) -> dict[str, Run]:
    """The runs to time for one network, each taking its number of steps: floors, ours and
    torchattacks."""
    import torchattacks

    module, shape, classes = network(name)
    plain = TorchPredictor(module, shape, classes, name=name)
    net = plain.network
    net_cl = copy.deepcopy(net).to(memory_format=CL)
    generator = torch.Generator().manual_seed(0)
    x = torch.rand((batch, *shape), generator=generator)
    with torch.no_grad():
        clean = net(x)
    y = clean.argmax(1)
    start = (x + EPS * (2 * torch.rand(x.shape, generator=generator) - 1)).clamp(0, 1)
    start_cl = start.contiguous(memory_format=CL)
    theirs = torchattacks.PGD(net, eps=EPS, alpha=EPS / 4)

    def ours(steps: int, p: str) -> object:
        attack = PGDLinf(steps=steps, step_size=EPS / 4, precision=p)
        return attack(plain, x, y, EPS, clean_logits=clean)

    def torchattacks_pgd(steps: int, evaluated: bool = False) -> object:
        theirs.steps = steps
        x_adv = theirs(x, y)
        if evaluated:  # the predictions an evaluation needs, which ours returns
            with torch.inference_mode():
                return net(x_adv)
        return x_adv

    bf16 = torch.bfloat16
    runs: dict[str, Run] = {
        "floor fp32": lambda steps: floor(net, start, y, steps, None),
        "floor fp32 reused": lambda steps: floor_reused(net, start, y, steps),
        "floor fp32-cl": lambda steps: floor(net_cl, start_cl, y, steps, None),
    }
    if "bf16" in precision.fast_precisions(torch.device("cpu")):
        runs["floor bf16"] = lambda steps: floor(net, start, y, steps, bf16)
        runs["floor bf16-cl"] = lambda steps: floor(net_cl, start_cl, y, steps, bf16)
    if compiled:
        net_compiled = torch.compile(net)
        runs["floor fp32-compiled"] = lambda steps: floor(net_compiled, start, y, steps, None)
    runs["ours fp32"] = lambda steps: ours(steps, "fp32")
    runs["ours auto"] = lambda steps: ours(steps, "auto")
    runs["torchattacks fp32"] = torchattacks_pgd
    runs["torchattacks+eval"] = lambda steps: torchattacks_pgd(steps, evaluated=True)
    return runs


def profile_steps(name: str, batch: int, low: int = 1, high: int = 3) -> None:
    """aten calls and self-CPU per step of ours and torchattacks (torch.profiler): each run
    profiled at ``low`` and ``high`` steps; per step is the difference over the extra steps,
    fixed is what a call costs besides (ours: random start, checks, the final forward pass)."""
    from torch.profiler import ProfilerActivity, profile

    runs = variants(name, batch, compiled=False)
    found: dict[str, dict[str, tuple[float, float]]] = {}
    for key in ("ours fp32", "torchattacks fp32"):
        runs[key](1)  # warm-up
        counted = []
        for steps in (low, high):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                runs[key](steps)
            counted.append(
                {e.key: (e.count, e.self_cpu_time_total / 1e3) for e in prof.key_averages()}
            )
        extra = high - low
        ops = set(counted[0]) | set(counted[1])
        zero = (0, 0.0)
        found[key] = {
            op: tuple(
                (counted[1].get(op, zero)[i] - counted[0].get(op, zero)[i]) / extra for i in (0, 1)
            )
            for op in ops
            if op.startswith("aten::")
        }
        fixed = {op: counted[0].get(op, zero)[0] - low * found[key][op][0] for op in found[key]}
        found[key + " fixed"] = {op: (n, 0.0) for op, n in fixed.items() if round(n)}
    ours, theirs = found["ours fp32"], found["torchattacks fp32"]
    print(
        f"\n== {name}, batch {batch}: aten calls and self-CPU ms per step (profiled at "
        f"{low} and {high} steps), ours / torchattacks"
    )
    print(f"{'op':34} {'calls ours':>10} {'theirs':>7} {'ms ours':>9} {'theirs':>9}")
    zero = (0, 0.0)
    for op in sorted(
        set(ours) | set(theirs), key=lambda o: -max(ours.get(o, zero)[1], theirs.get(o, zero)[1])
    ):
        a, b = ours.get(op, zero), theirs.get(op, zero)
        if round(a[0], 1) or round(b[0], 1):
            print(f"{op:34} {a[0]:10.1f} {b[0]:7.1f} {a[1]:9.1f} {b[1]:9.1f}")
    for key in ("ours fp32", "torchattacks fp32"):
        total = sum(v[1] for v in found[key].values())
        calls = sum(v[0] for v in found[key].values())
        print(f"{key}: {calls:.0f} aten calls, {total:.0f} ms self-CPU per step")
        fixed = found[key + " fixed"]
        print(
            f"  per call besides the steps: {sum(v[0] for v in fixed.values()):.0f} aten calls ("
            + ", ".join(
                f"{op[6:]} {n:.0f}"
                for op, (n, _) in sorted(fixed.items(), key=lambda i: -i[1][0])[:8]
            )
            + ")"
        )


def paired(times: dict[str, list[float]], a: str, b: str) -> float:
    return statistics.median(t / r for t, r in zip(times[a], times[b], strict=True))


def interleaved(runs: dict[str, Run], steps: int, rounds: int, clock: Callable[[], float]) -> dict:
    times: dict[str, list[float]] = {k: [] for k in runs}
    for round_ in range(rounds):
        for key, run in runs.items():
            started = clock()
            run(steps)
            times[key].append(clock() - started)
        done = ", ".join(f"{key} {values[-1]:.2f}" for key, values in times.items())
        print(f"  round {round_ + 1}/{rounds}: {done}", flush=True)
    return times


def time_net(
    name: str, batch: int, steps: int, rounds: int, compiled: bool, only: list[str], clock
) -> None:
    runs = variants(name, batch, compiled)
    if only:  # the fp32 floor is every ratio's reference
        runs = {k: run for k, run in runs.items() if k in {"floor fp32", *only}}
    warm = time.perf_counter()
    for run in runs.values():  # warm-up, one step: oneDNN kernels, compilation, allocator
        run(1)
    warm = time.perf_counter() - warm
    load = os.getloadavg()[0]
    times = interleaved(runs, steps, rounds, clock)
    after = os.getloadavg()[0]
    print(f"\n== {name}, batch {batch}, PGD-{steps} l-inf {EPS:.4f} step eps/4, {rounds} "
          f"rounds (warm-up {warm:.0f} s); load {load:.1f} before, {after:.1f} after")  # fmt: skip
    print(f"{'':20} {'median s':>9} {'images/s':>9} {'x floor fp32':>13}")
    for key, values in times.items():
        median = statistics.median(values)
        print(
            f"{key:20} {median:9.3f} {batch / median:9.2f} {paired(times, key, 'floor fp32'):13.3f}"
        )
    targets(times)


def targets(times: dict[str, list[float]]) -> None:
    """The issue's targets, each printed where its rows were timed (``--only``)."""
    have = set(times)
    floor_auto = "floor bf16-cl" if "floor bf16-cl" in have else "floor fp32"
    if "ours auto" in have:
        print(f"ours auto / its floor ({floor_auto}): {paired(times, 'ours auto', floor_auto):.3f}")
    if "ours fp32" in have:
        ratio = paired(times, "ours fp32", "floor fp32")
        print(f"TARGET ours fp32 <= 1.05x fp32 floor: {ratio:.3f} ({_verdict(ratio <= 1.05)})")
    if {"ours fp32", "floor fp32 reused"} <= have:
        print(f"  ours fp32 / the floor with freed memory reused (the attack's own work): "
              f"{paired(times, 'ours fp32', 'floor fp32 reused'):.3f}")  # fmt: skip
    if {"ours fp32", "torchattacks fp32"} <= have:
        versus = paired(times, "ours fp32", "torchattacks fp32")
        print(f"TARGET ours fp32 faster than torchattacks: ours/torchattacks {versus:.3f} "
              f"({_verdict(versus < 1)})")  # fmt: skip
    if {"ours fp32", "torchattacks+eval"} <= have:
        print(f"  ours/(torchattacks + the forward pass on its result an evaluation needs): "
              f"{paired(times, 'ours fp32', 'torchattacks+eval'):.3f}")  # fmt: skip
    if {"ours fp32", "ours auto"} <= have:
        speedup = 1 / paired(times, "ours auto", "ours fp32")
        print(f"TARGET auto >= 2x fp32 (a CPU with AMX): {speedup:.2f}x "
              f"({_verdict(speedup >= 2)})")  # fmt: skip
    if {"ours auto", "torchattacks fp32"} <= have:
        print(f"  ours auto / torchattacks fp32: "
              f"{paired(times, 'ours auto', 'torchattacks fp32'):.3f}")  # fmt: skip


def _verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def accuracy(images: int, steps: int) -> None:
    """Robust accuracy of our PGD on a trained zoo model, fp32 against ``auto``."""
    from aisafety.database.datasets.embedded import EmbeddedMnist
    from aisafety.database.zoo import load_zoo_model

    model = load_zoo_model("mnist-cnn-pgd-at")
    data = EmbeddedMnist().load(None, "test")
    x, y = data.x[:images], data.y[:images]
    found = {
        p: PGDLinf(steps=steps, step_size=0.01, precision=p)(model, x, y, 0.3).robust_accuracy
        for p in ("fp32", "auto")
    }
    gap = abs(found["auto"] - found["fp32"])
    print(f"\n== robust accuracy of PGD-{steps} at l-inf 0.3, mnist-cnn-pgd-at, {len(x)} images: "
          f"fp32 {found['fp32']:.4f}, auto {found['auto']:.4f}")  # fmt: skip
    print(f"TARGET auto within 0.005 of fp32: gap {gap:.4f} ({_verdict(gap <= 0.005)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="default: torch's")
    parser.add_argument("--nets", nargs="+", default=["wrn-28-10", "resnet-50"])
    parser.add_argument(
        "--batch", nargs="+", default=["wrn-28-10=8", "resnet-50=2", "mnist-cnn=128"]
    )
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--accuracy-images", type=int, default=1000, help="0: none")
    parser.add_argument("--compile", action="store_true", help="also a torch.compile'd floor")
    parser.add_argument("--only", nargs="+", default=[], help="these rows (and floor fp32)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script runs")
    parser.add_argument(
        "--profile", action="store_true", help="aten calls per step, ours and torchattacks"
    )
    parser.add_argument(
        "--cpu-time", action="store_true", help="CPU seconds with several threads too"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    batches = {k: int(v) for k, v in (item.split("=") for item in args.batch)}
    if args.smoke:
        batches, args.steps, args.rounds = dict.fromkeys(batches, 1), 2, 1
        args.accuracy_images = 32
    threads = torch.get_num_threads()
    cpu = threads == 1 or args.cpu_time
    clock = time.process_time if cpu else time.perf_counter
    print(f"torch {torch.__version__}, {threads} threads, times in "
          f"{'CPU' if cpu else 'wall'} seconds; {cpu_line()}")  # fmt: skip
    if args.profile:
        for net in args.nets:
            profile_steps(net, batches[net])
        return
    for net in args.nets:
        time_net(net, batches[net], args.steps, args.rounds, args.compile, args.only, clock)
    if args.accuracy_images:
        accuracy(args.accuracy_images, args.steps)


if __name__ == "__main__":
    main()
