"""Verifier cost, next to a forward pass, and the complete verifier on VNN-COMP mnistfc.

    python bench/verification.py [--part crown|complete|tightness|cnn-tightness|all]
                                 [--images 1000] [--eps 0.1] [--nets 256x2 ...]
                                 [--timeout 60] [--threads 2] [--cpu-limit 60]
                                 [--cnn-images 100] [--alpha-steps 20]
                                 [--verifiers complete bab] [--per-net 0] [--clock wall]
                                 [--suite mnistfc|eran|cifar] [--only prop_1_ ...]
                                 [--out results.jsonl]

1. CROWN (and IBP, CROWN-IBP) on ``--images`` embedded MNIST test images for the zoo's
   ``mnist-cnn-strided-crown-ibp`` at ``--eps``: seconds, certified fraction, and the ratio
   to one forward pass of the same images (median of interleaved pairs).
2. ``--verifiers`` (default: complete; e.g. ``complete/milp bab``: ``/`` forces an
   engine, ``bab:branching=babsr,intermediate_bounds=false`` sets options) side by side
   on every instance of ``vnncomp2021_mnistfc`` (or ``--suite eran``, or ``cifar``: the
   ResNets and Marabou nets of ``cifar10-models``) for ``--nets``
   (``../shared/data``; ``--per-net`` caps the instances per net), each with ``--timeout``
   seconds on ``--clock``: status (sat / unsat / timeout / unknown, with the engine
   ``complete`` picked), wall and CPU seconds. The settled count (sat + unsat) per net and
   verifier is printed at the end. The machine is shared, so CPU
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
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "testkit")]
from abcrown.run import instances as suite_instances  # noqa: E402  (the same sets)
from abcrown.run import select  # noqa: E402
from shared_location import shared_data  # noqa: E402


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


def parse_verifier(name: str) -> tuple[str, dict]:
    """``complete/milp`` forces an engine; ``bab:branching=babsr,intermediate_bounds=0``
    sets config fields (numbers and booleans as YAML reads them)."""
    import yaml

    name, _, options = name.partition(":")
    verifier, _, engine = name.partition("/")
    config = {"engine": engine} if engine else {}
    for pair in filter(None, options.split(",")):
        key, _, value = pair.partition("=")
        config[key] = yaml.safe_load(value)
    return verifier, config


def complete_part(
    nets: list[str],
    timeout: float,
    cpu_limit: float,
    verifiers: list[str] = ("complete",),
    per_net: int = 0,
    clock: str = "wall",
    suite: str = "mnistfc",
    only: list[str] = (),
    out: str = "",
) -> None:
    """Each of ``verifiers`` on every instance of ``suite`` (``mnistfc``, ``eran`` or
    ``cifar``) for ``nets`` (the first ``per_net`` of each net, 0: all; properties named
    with one of ``only``), side by side: status, engine (``complete``: milp or bab), wall
    and CPU seconds; settled counts per net and verifier; each result also as a JSON line
    appended to ``out`` (the format of ``bench/abcrown/run.py``)."""
    from aisafety.plugins import default_registry
    from aisafety.verification.vnncomp import verify_instance

    instances = select(suite_instances(suite), nets, per_net, only)
    # built once, before any row's clock: its first build (0.29 s of CPU, the plugins'
    # imports) is the process's setup, which no instance's limit can see
    registry = default_registry()
    settled: dict[tuple[str, str], list[int]] = {}
    print(f"{suite}, timeout {timeout:g} s ({clock} clock), {torch.get_num_threads()} thread(s); "
          f"load average at start {os.getloadavg()[0]:.1f}")  # fmt: skip
    head = " ".join(f"{v + ' status':>18} {'wall s':>7} {'cpu s':>7}" for v in verifiers)
    print(f"{'network':<34} {'property':<38} {head}")
    for net, onnx_path, spec in instances:
        cells = []
        for name in verifiers:
            verifier, config = parse_verifier(name)
            config = {"clock": clock, **config}
            wall, cpu = time.perf_counter(), time.process_time()
            result = verify_instance(registry, onnx_path, spec, verifier, timeout, config)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            done = result.status in ("sat", "unsat")
            counts = settled.setdefault((net, name), [0, 0, 0])
            counts[0] += done
            counts[1] += done and cpu <= cpu_limit
            counts[2] += 1
            status = f"{result.status}({result.how})" if result.how != verifier else result.status
            cells.append(f"{status:>18} {wall:>7.1f} {cpu:>7.1f}")
            row = {"suite": suite, "net": net, "property": spec.name, "tool": name,
                   "engine": result.how, "status": result.status, "cpu_s": round(cpu, 2),
                   "wall_s": round(wall, 2), "timeout": timeout, "clock": clock,
                   "margin": result.margin, "note": result.note}  # fmt: skip
            if out:
                with open(out, "a") as f:
                    f.write(json.dumps(row) + "\n")
        print(f"{net:<34} {spec.name:<38} {' '.join(cells)}", flush=True)
    for (net, name), (done, within, n) in settled.items():
        print(f"{net:<34} {name:<10} settled {done}/{n}; within {cpu_limit:g} s of CPU: "
              f"{within}/{n}")  # fmt: skip
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


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
    mnistfc = shared_data("vnncomp2021_mnistfc")
    for net in nets:
        predictor = load_onnx(mnistfc / f"mnist-net_{net}.onnx", gradients=True, input_shape=shape)
        graph = build_graph(predictor.network.cpu(), shape, net)
        for eps in ("0.03", "0.05"):
            counts, cpu, nested = dict.fromkeys(names, 0), dict.fromkeys(names, 0.0), True
            for i in range(15):
                prop = read_vnnlib(mnistfc / f"prop_{i}_{eps}.vnnlib", math.prod(shape), 10)
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
    parser.add_argument("--verifiers", nargs="*", default=["complete"], help="for complete")
    parser.add_argument("--per-net", type=int, default=0, help="instances per net (0: all)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    parser.add_argument("--suite", choices=["mnistfc", "eran", "cifar"], default="mnistfc")
    parser.add_argument("--only", nargs="*", default=[], help="properties naming one of these")
    parser.add_argument("--out", default="", help="append one JSON line per result here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.part in ("crown", "all"):
        crown_part(args.images, args.eps)
    if args.part in ("tightness", "all"):
        tightness_part(args.nets)
    if args.part in ("cnn-tightness", "all"):
        cnn_tightness_part(args.cnn_images, args.eps, args.alpha_steps, args.timeout)
    if args.part in ("complete", "all"):
        complete_part(args.nets, args.timeout, args.cpu_limit, args.verifiers, args.per_net,
                      args.clock, args.suite, args.only, args.out)  # fmt: skip


if __name__ == "__main__":
    main()
