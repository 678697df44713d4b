"""Verifier cost, next to a forward pass, and the complete verifier on VNN-COMP mnistfc.

    python bench/verification.py [--part crown|complete|tightness|cnn-tightness|all]
                                 [--images 1000] [--eps 0.1] [--nets 256x2 ...]
                                 [--timeout 60] [--threads 2] [--cpu-limit 60]
                                 [--cnn-images 100] [--alpha-steps 20]

1. CROWN (and IBP, CROWN-IBP) on ``--images`` embedded MNIST test images for the zoo's
   ``mnist-cnn-strided-crown-ibp`` at ``--eps``: seconds, certified fraction, and the ratio
   to one forward pass of the same images (median of interleaved pairs).
2. The complete verifier on every instance of ``vnncomp2021_mnistfc`` for ``--nets``
   (``../shared/data``), each with ``--timeout`` seconds: status (sat / unsat / timeout /
   unknown), wall and CPU seconds, and the time of one forward pass of the network. The
   settled fraction (sat + unsat) is printed at the end. The machine is shared, so CPU
   seconds (process time) are printed next to wall seconds, with the load average, and
   the fraction settled within ``--cpu-limit`` seconds of CPU is printed too (run with a
   longer ``--timeout`` on a loaded machine: HiGHS's limit is wall-clock).
3. Tightness: certified instances (of the 15 properties per eps) per incomplete verifier
   on each of ``--nets``, CPU seconds in brackets, and whether the certified sets are
   nested on every instance.
4. CNN tightness: every verifier, the complete one included (``--timeout`` per image), on
   ``--cnn-images`` evenly spaced embedded images for ``mnist-cnn-strided-crown-ibp`` at
   ``--eps``: certified fraction, verdict counts, CPU seconds, nesting per image.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "vnncomp2021_mnistfc"
if not DATA.is_dir():
    DATA = Path("/work/shared/data/vnncomp2021_mnistfc")


def forward_seconds(fn, x: torch.Tensor, repeats: int = 5) -> float:
    times = []
    with torch.no_grad():
        for _ in range(repeats):
            start = time.perf_counter()
            fn(x)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def crown_part(images: int, eps: float) -> None:
    from aisafety.database.datasets.embedded import EmbeddedMnist
    from aisafety.database.zoo import load_zoo_model
    from aisafety.plugins import default_registry
    from aisafety.verification.graph import build_graph
    from aisafety.verification.property import robustness_property
    from aisafety.verification.registry import make_verifier

    predictor = load_zoo_model("mnist-cnn-strided-crown-ibp")
    data = EmbeddedMnist().load(None, "test")
    x, y = data.x[:images], data.y[:images]
    graph = build_graph(predictor.network, predictor.input_shape, predictor.name)
    prop = robustness_property(x, y, eps, predictor.num_classes)
    print(f"mnist-cnn-strided-crown-ibp, {len(y)} images, eps {eps}, {torch.get_num_threads()} "
          f"thread(s); load average at start {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'verifier':<12} {'certified':>9} {'seconds':>8} {'cpu s':>8} {'forward s':>9} "
          f"{'ratio':>8}")  # fmt: skip
    for name in ("ibp", "crown-ibp", "crown"):
        verifier = make_verifier(default_registry(), name, {"batch_size": 100})
        ratios, runs, cpu = [], [], []
        for _ in range(2):  # interleaved pairs: forward, verifier
            fwd = forward_seconds(predictor.logits, x, repeats=1)
            start, cpu_start = time.perf_counter(), time.process_time()
            result = verifier.verify(graph, prop, predictor.logits)
            runs.append(time.perf_counter() - start)
            cpu.append(time.process_time() - cpu_start)
            ratios.append(runs[-1] / fwd)
        cert = result.certified.double().mean().item()
        print(f"{name:<12} {cert:>9.3f} {statistics.median(runs):>8.2f} "
              f"{statistics.median(cpu):>8.2f} "
              f"{statistics.median(runs) / statistics.median(ratios):>9.4f} "
              f"{statistics.median(ratios):>8.0f}x")  # fmt: skip
    print(f"load average at end {os.getloadavg()[0]:.1f}")


def complete_part(nets: list[str], timeout: float, cpu_limit: float) -> None:
    from aisafety.plugins import default_registry
    from aisafety.prediction.onnx_model import OnnxRuntimePredictor
    from aisafety.verification.vnncomp import verify_instance

    with (DATA / "mnistfc_instances.csv").open() as f:
        instances = [row for row in csv.reader(f) if row and any(n in row[0] for n in nets)]
    counts: dict[str, int] = {}
    within_cpu = 0
    print(f"load average at start: {os.getloadavg()[0]:.1f} (2 cores are idle at 0-2)")
    print(
        f"{'network':<22} {'property':<20} {'status':<8} {'wall s':>7} {'cpu s':>7} {'fwd ms':>7}"
    )
    for onnx_name, spec, _ in instances:
        network = DATA / onnx_name
        reference = OnnxRuntimePredictor(network, input_shape=(1, 28, 28))
        fwd = forward_seconds(reference.logits, torch.rand(1, 1, 28, 28))
        wall, cpu = time.perf_counter(), time.process_time()
        result = verify_instance(default_registry(), network, DATA / spec, "complete", timeout)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        counts[result.status] = counts.get(result.status, 0) + 1
        within_cpu += result.status in ("sat", "unsat") and cpu <= cpu_limit
        print(f"{onnx_name:<22} {spec:<20} {result.status:<8} {wall:>7.1f} {cpu:>7.1f} "
              f"{fwd * 1e3:>7.2f}", flush=True)  # fmt: skip
    settled = counts.get("sat", 0) + counts.get("unsat", 0)
    n = max(1, len(instances))
    print(f"settled within {timeout:g} s wall: {settled}/{len(instances)} ({settled / n:.0%}) "
          f"{counts}; settled using <= {cpu_limit:g} s of process CPU: {within_cpu}/"
          f"{len(instances)} ({within_cpu / n:.0%}); load average at end: "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip


def tightness_part(nets: list[str]) -> None:
    """Certified instances per verifier on the mnistfc properties, and whether the certified
    sets are nested (IBP <= CROWN-IBP, CROWN <= alpha-CROWN) on every instance."""
    import math

    from aisafety.plugins import default_registry
    from aisafety.prediction.onnx_model import load_onnx
    from aisafety.verification.graph import build_graph
    from aisafety.verification.registry import make_verifier
    from aisafety.verification.vnnlib import read_vnnlib

    names = ["ibp", "crown-ibp", "crown", "alpha-crown"]
    shape = (1, 28, 28)
    print(f"{'network':<8} {'eps':<5} " + " ".join(f"{n:>12}" for n in names) + "  nested")
    for net in nets:
        predictor = load_onnx(DATA / f"mnist-net_{net}.onnx", gradients=True, input_shape=shape)
        graph = build_graph(predictor.network.cpu(), shape, net)
        for eps in ("0.03", "0.05"):
            counts, cpu, nested = dict.fromkeys(names, 0), dict.fromkeys(names, 0.0), True
            for i in range(15):
                prop = read_vnnlib(DATA / f"prop_{i}_{eps}.vnnlib", math.prod(shape), 10)
                prop.lower = prop.lower.reshape(1, *shape)
                prop.upper = prop.upper.reshape(1, *shape)
                got = {}
                for name in names:
                    start = time.process_time()
                    result = make_verifier(default_registry(), name).verify(graph, prop)
                    cpu[name] += time.process_time() - start
                    got[name] = bool(result.certified[0])
                    counts[name] += got[name]
                order = [got["ibp"] <= got["crown-ibp"], got["crown"] <= got["alpha-crown"]]
                nested &= all(order)
            cells = " ".join(f"{counts[n]:>3} ({cpu[n]:>5.1f}s)" for n in names)
            print(f"{net:<8} {eps:<5} {cells}  {nested}", flush=True)


def cnn_tightness_part(images: int, eps: float, alpha_steps: int, timeout: float) -> None:
    """Certified fraction per verifier, complete included, on ``images`` evenly spaced
    embedded test images for the zoo's ``mnist-cnn-strided-crown-ibp`` at ``eps``, and
    whether the certified sets are nested per image (IBP <= CROWN-IBP, IBP <= CROWN <=
    alpha-CROWN <= complete), with the complete verifier's verdict counts."""
    from aisafety.database.datasets.embedded import EmbeddedMnist
    from aisafety.database.zoo import load_zoo_model
    from aisafety.plugins import default_registry
    from aisafety.verification.graph import build_graph
    from aisafety.verification.property import robustness_property
    from aisafety.verification.registry import make_verifier

    predictor = load_zoo_model("mnist-cnn-strided-crown-ibp")
    data = EmbeddedMnist().load(None, "test")
    step = max(1, len(data.y) // images)
    x, y = data.x[::step][:images], data.y[::step][:images]
    graph = build_graph(predictor.network, predictor.input_shape, predictor.name)
    prop = robustness_property(x, y, eps, predictor.num_classes)
    configs = {
        "ibp": {}, "crown-ibp": {}, "crown": {}, "alpha-crown": {"steps": alpha_steps},
        "complete": {"alpha_steps": alpha_steps, "timeout": timeout},
    }  # fmt: skip
    print(f"mnist-cnn-strided-crown-ibp, {len(y)} images (every {step}th), eps {eps}, "
          f"alpha steps {alpha_steps}, complete timeout {timeout:g} s; load average "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    certified, verdicts = {}, {}
    for name, config in configs.items():
        start = time.process_time()
        result = make_verifier(default_registry(), name, config).verify(
            graph, prop, predictor.logits
        )
        certified[name] = result.certified
        verdicts[name] = {v: sum(r.value == v for r in result.verdicts)
                          for v in ("certified", "falsified", "unknown")}  # fmt: skip
        print(f"{name:<12} certified {result.certified.double().mean():.3f}  "
              f"{verdicts[name]}  cpu {time.process_time() - start:.1f} s", flush=True)  # fmt: skip
    chain = [("ibp", "crown-ibp"), ("ibp", "crown"), ("crown", "alpha-crown"),
             ("alpha-crown", "complete")]  # fmt: skip
    nested = all(bool((certified[a] <= certified[b]).all()) for a, b in chain)
    print(f"nested per image (ibp<=crown-ibp, ibp<=crown<=alpha-crown<=complete): {nested}; "
          f"load average at end {os.getloadavg()[0]:.1f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parts = ["crown", "complete", "tightness", "cnn-tightness", "all"]
    parser.add_argument("--part", choices=parts, default="all")
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--eps", type=float, default=0.1)
    parser.add_argument("--nets", nargs="*", default=["256x2"])
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cnn-images", type=int, default=100, help="images for cnn-tightness")
    parser.add_argument("--alpha-steps", type=int, default=20, help="for cnn-tightness")
    parser.add_argument(
        "--cpu-limit", type=float, default=60.0, help="also count settled within this CPU time"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.part in ("crown", "all"):
        crown_part(args.images, args.eps)
    if args.part in ("tightness", "all"):
        tightness_part(args.nets)
    if args.part in ("cnn-tightness", "all"):
        cnn_tightness_part(args.cnn_images, args.eps, args.alpha_steps, args.timeout)
    if args.part in ("complete", "all"):
        complete_part(args.nets, args.timeout, args.cpu_limit)


if __name__ == "__main__":
    main()
