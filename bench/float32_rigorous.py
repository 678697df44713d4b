"""What ``float32: rigorous`` costs and how far its bound is above the rounding it bounds
(verification/float32_rounding.py; docs/certification.md, "Float32 certificates").

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 5 python3 bench/float32_rigorous.py \
        [coverage] [sok] [sok-alpha] [speed PAIRS] [eran]

- coverage: per fuzz net (testkit/attack_fuzz.py's seeds) and SoK model (20 MNIST images),
  row by row: the rounding term (CROWN's final pass on the setting's boxes, without and
  with the ops' float32 errors subtracted) against the largest measured |f32 - f64| of that
  row over 64 float32 points of the box (the float32 network and its float64 copy on the
  same points): the smallest term / measured; whether the rigorous bound is below the
  float32 rows at every point; and the whole cost, exact CROWN minus rigorous CROWN (wider
  boxes too; negative where a widened box flips CROWN's adaptive slope choice).
- sok: the SoK cells (the 100 images of examples/sok-mnist.yaml, eps 0.02 / 0.1 / 0.3,
  crown-ibp and crown) certified with each setting, and each cell's CPU seconds.
- sok-alpha: the same with alpha-crown, on the FCNNb models.
- speed: CROWN on sok-fcnn-b-clean at 0.02 (100 images), exact against rigorous,
  interleaved, paired medians of CPU time, one thread.
- eran: VNN-COMP 2021 eran mnist_relu_9_200 spec 8098 with crown, both settings.
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from attack_fuzz import random_case  # noqa: E402
from paired import interleaved, one_thread, paired_median  # noqa: E402

from aisafety.database.zoo import load_zoo_model  # noqa: E402
from aisafety.interfaces import DatasetSpec  # noqa: E402
from aisafety.loading import load_data  # noqa: E402
from aisafety.plugins import default_registry  # noqa: E402
from aisafety.verification import bounds as b  # noqa: E402
from aisafety.verification import float32_rounding, receptive  # noqa: E402
from aisafety.verification.graph import VerificationError, build_graph  # noqa: E402
from aisafety.verification.property import robustness_property  # noqa: E402

REGISTRY = default_registry()
SEEDS = (13, 15, 17, 57, 61, 119, 189, 234, 616)
MODELS = [f"sok-{a}-{b}" for a in ("fcnn-a", "fcnn-b") for b in ("clean", "adv1", "adv3")]
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def crown(setting: str):
    return REGISTRY.create("verifier", "crown", {"clock": "cpu", "float32": setting})


def bounds(graph, prop, setting: str) -> torch.Tensor:
    v = crown(setting)
    v.check(graph)
    with torch.no_grad(), v.arithmetic():
        return v.lower_bounds(graph, prop.to(torch.float64))[0]


def measured(net, prop, points: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the largest |f32 - f64| and the least float32 row over float32 points of
    the box (corners among them)."""
    wide, gen = copy.deepcopy(net).double(), torch.Generator().manual_seed(0)
    worst = torch.zeros(prop.spec.shape[:2], dtype=torch.float64)
    least = torch.full(prop.spec.shape[:2], torch.inf, dtype=torch.float64)
    for k in range(points):
        draw = torch.rand(prop.lower.shape, generator=gen, dtype=torch.float64)
        draw = (draw > 0.5).double() if k < points // 4 else draw
        x = (prop.lower + draw * (prop.upper - prop.lower)).float()
        x = torch.minimum(torch.maximum(x.double(), prop.lower), prop.upper).float()
        with torch.no_grad():
            f32, f64 = net(x).double(), wide(x.double())
        rows32 = torch.einsum("bko,bo->bk", prop.spec, f32)
        rows64 = torch.einsum("bko,bo->bk", prop.spec, f64)
        worst = torch.maximum(worst, (rows32 - rows64).abs())
        least = torch.minimum(least, rows32)
    return worst, least


def cover(name: str, net, shape, x, y, eps: float, classes: int) -> None:
    graph = build_graph(net, shape, name).in_dtype(torch.float64)
    prop = robustness_property(x, y, eps, classes).to(torch.float64)
    try:
        exact, rigorous = bounds(graph, prop, "exact"), bounds(graph, prop, "rigorous")
    except VerificationError as error:
        print(f"{name}: refused ({str(error)[:80]})")
        return
    worst, least = measured(net, prop)
    term = rounding_term(graph, prop)
    gap = exact - rigorous
    ratio = (term / worst.clamp_min(1e-300))[worst > 0]
    print(f"{name} eps {eps:g}: rounding term {float(term.min()):.2g}..{float(term.max()):.2g}, "
          f"measured max {float(worst.max()):.2g}, term/measured >= {float(ratio.min()):.3g}, "
          f"covers {bool((term >= worst).all())}, rigorous below every float32 row "
          f"{bool((rigorous <= least).all())}; exact - rigorous {float(gap.min()):.2g}.."
          f"{float(gap.max()):.2g}", flush=True)  # fmt: skip


def rounding_term(graph, prop) -> torch.Tensor:
    """Per row, what the float32 errors take off CROWN's final pass on the same boxes
    (the setting's, which hold the float32 values)."""
    prop = prop.to(torch.float64)
    with torch.no_grad(), float32_rounding.rigorous(), receptive.dense_passes():
        boxes = b.linear_boxes(graph, prop.lower, prop.upper)
        rigorous = b.spec_lower(graph, boxes, prop.spec)[0]
    with torch.no_grad(), receptive.dense_passes():
        plain = b.spec_lower(graph, boxes, prop.spec)[0]
    return plain - rigorous


def mnist(limit: int):
    spec = DatasetSpec(name="mnist", path=str(SHARED / "mnist"), limit=limit,
                       sampling="uniform", seed=0)  # fmt: skip
    data = load_data(spec, REGISTRY)
    return data.x, data.y


def coverage() -> None:
    for seed in SEEDS:
        case = random_case(seed, REGISTRY)
        if case.defended:
            continue
        net, shape = case.predictor.network, case.predictor.input_shape
        cover(f"fuzz {seed}", net, shape, case.x, case.y, case.eps, case.predictor.num_classes)
    x, y = mnist(20)
    for name in MODELS:
        predictor = load_zoo_model(name)
        for eps in (0.02, 0.1):
            cover(name, predictor.network, predictor.input_shape, x, y, eps, 10)


def sok(verifiers=("crown-ibp", "crown"), models=MODELS) -> None:
    x, y = mnist(100)
    for name in models:
        predictor = load_zoo_model(name)
        net = predictor.network
        graph = build_graph(net, predictor.input_shape, name)
        with torch.no_grad():
            right = net(x).argmax(1) == y
        for eps in (0.02, 0.1, 0.3):
            prop = robustness_property(x[right], y[right], eps, 10)
            for verifier in verifiers:
                line = []
                for setting in ("exact", "rigorous"):
                    v = REGISTRY.create("verifier", verifier, {"clock": "cpu",
                                                               "float32": setting})  # fmt: skip
                    began = time.process_time()
                    result = v.verify(graph, prop, net)
                    line.append(f"{setting} {int(result.certified.sum())} "
                                f"({time.process_time() - began:.1f} s)")  # fmt: skip
                print(f"{name} eps {eps:g} {verifier}: " + ", ".join(line), flush=True)


def speed(pairs: int) -> None:
    print(one_thread())
    x, y = mnist(100)
    predictor = load_zoo_model("sok-fcnn-b-clean")
    net = predictor.network
    graph = build_graph(net, predictor.input_shape, "sok-fcnn-b-clean")
    prop = robustness_property(x, y, 0.02, 10)

    def run(setting: str) -> float:
        began = time.process_time()
        crown(setting).verify(graph, prop, net)
        return time.process_time() - began

    times = interleaved(("rigorous", "exact"), run, pairs)
    ratios = [a / b for a, b in zip(times["rigorous"], times["exact"], strict=True)]
    print(f"crown sok-fcnn-b-clean 0.02, 100 images: rigorous/exact "
          f"{paired_median(times['rigorous'], times['exact']):.3f} ({min(ratios):.3f}-"
          f"{max(ratios):.3f}), exact {times['exact'][-1]:.2f} s", flush=True)  # fmt: skip


def eran() -> None:
    from aisafety.verification.vnncomp import verify_instance

    folder = SHARED / "vnncomp2021_eran"
    network = next(folder.rglob("mnist_relu_9_200.onnx"))
    spec = next(folder.rglob("mnist_spec_idx_8098_eps_0.01500.vnnlib"))
    for setting in ("exact", "rigorous"):
        began = time.process_time()
        out = verify_instance(REGISTRY, network, spec, "crown", 60.0,
                              {"clock": "cpu", "float32": setting})  # fmt: skip
        print(
            f"eran 9x200 spec 8098 crown {setting}: {out.status}, margin {out.margin:.4f} "
            f"({time.process_time() - began:.1f} CPU s) {out.note}",
            flush=True,
        )


if __name__ == "__main__":
    args = sys.argv[1:] or ["coverage", "eran"]
    torch.set_num_threads(1)
    if "coverage" in args:
        coverage()
    if "eran" in args:
        eran()
    if "sok" in args:
        sok()
    if "sok-alpha" in args:  # alpha-crown on FCNNb, where crown loses a sample
        sok(("alpha-crown",), [m for m in MODELS if "fcnn-b" in m])
    if "speed" in args:
        speed(int(args[args.index("speed") + 1]))
