"""CROWN and alpha-CROWN on the VNN-COMP 2021 CIFAR ResNets, within the default memory
budget: verified accuracy on the 100 shipped CIFAR-10 test images beside the benchmark's
published CROWN/DeepPoly figures (Wang et al. 2021, full test set), every certified image
robust against the ``standard`` attack, alpha-CROWN at least as high on every image."""

from __future__ import annotations

import resource
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from aisafety.plugins import default_registry
from aisafety.report.intervals import clopper_pearson
from aisafety.verification.graph import build_graph
from aisafety.verification.incomplete import AlphaCrownVerifier, CrownVerifier
from aisafety.verification.property import robustness_property

ROOT = Path(__file__).resolve().parents[1]
DATA = next(
    (p for p in (ROOT.parent / "shared" / "data", ROOT.parents[1] / "shared" / "data")
     if p.is_dir()), ROOT.parent / "shared" / "data",
)  # fmt: skip
NETS = DATA / "cifar10-models" / "vnncomp2021_cifar10_resnet"
IMAGES = DATA / "eran_test_subsets" / "cifar10_test.csv"
MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2471, 0.2435, 0.2616)  # data README section 6

pytestmark = pytest.mark.skipif(not NETS.is_dir(), reason="shared CIFAR-10 models absent")


def vnncomp_resnet(name: str):
    """The ONNX net with its external normalisation, as a gradient predictor."""
    from aisafety.prediction.onnx_model import load_onnx

    return load_onnx(NETS / f"{name}.onnx", gradients=True, mean=MEAN, std=STD, name=name)


def cifar_images(n: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    data = np.loadtxt(IMAGES, delimiter=",")[:n]
    x = torch.tensor(data[:, 1:] / 255.0, dtype=torch.float32).reshape(-1, 32, 32, 3)
    return x.permute(0, 3, 1, 2).contiguous(), torch.tensor(data[:, 0], dtype=torch.long)


def test_both_resnets_convert_and_build_a_bound_graph_within_the_default_budget():
    x, y = cifar_images(2)
    for name in ("resnet_2b", "resnet_4b"):
        predictor = vnncomp_resnet(name)
        graph = build_graph(predictor.network, predictor.input_shape, name)
        verifier = CrownVerifier()
        prop = robustness_property(x, y, 1 / 255, 10)
        assert verifier.fitting_batch(graph, prop, verifier.memory_budget()) == 2


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "eps", "published"),
    [("resnet_2b", 2, 26.88), ("resnet_2b", 1, 57.16), ("resnet_4b", 1, 23.28)],
)
def test_crown_verified_accuracy_of_the_vnncomp_resnets_on_100_images(name, eps, published):
    """The time limit counts CPU seconds (60 per image, ample), so a busy machine cannot
    turn a bound into a ``timeout``; the counts are checked per image, margins included."""
    predictor = vnncomp_resnet(name)
    x, y = cifar_images()
    graph = build_graph(predictor.network, predictor.input_shape, name)
    prop = robustness_property(x, y, eps / 255, 10)
    cpu = [time.process_time()]
    config = {"batch_size": 20, "clock": "cpu"}
    crown = CrownVerifier(config).verify(graph, prop, predictor.logits)
    cpu.append(time.process_time())
    attack = default_registry().create("attack", "standard", {})
    broken = attack(predictor, x, y, eps / 255).success | (predictor.logits(x).argmax(1) != y)
    cpu.append(time.process_time())
    print(f"\n{name} eps {eps}/255: CROWN certified {crown.certified.nonzero().flatten().tolist()}"
          f"; standard leaves {int((~broken).sum())}; CPU s {cpu[1] - cpu[0]:.0f} (CROWN), "
          f"{cpu[2] - cpu[1]:.0f} (standard)")  # fmt: skip
    assert not (crown.certified & broken).any()  # a certificate the attack breaks: unsound
    # alpha-CROWN on every unbroken image: first where it can add a certificate, then where
    # it must keep CROWN's (each stage printed as it ends, for a run cut short)
    todo = ~broken
    alpha = torch.full((len(x),), float("nan"))
    for where in (todo & ~crown.certified, todo & crown.certified):
        alpha[where] = alpha_crown_margins(graph, prop, where, config)
    cpu.append(time.process_time())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)
    report(name, eps, published, crown, alpha[todo] > 0, todo, broken, cpu, peak)
    certified = torch.zeros_like(crown.certified)
    certified[todo] = alpha[todo] > 0
    assert (certified >= crown.certified).all()
    # per image, alpha-CROWN's margin bound is CROWN's or higher (it keeps CROWN's bound)
    gain = alpha[todo] - crown.margins[todo]
    print(f"alpha-CROWN margin minus CROWN's on unbroken images: min {gain.min():.3g}, "
          f"median {gain.median():.3g}, max {gain.max():.3g}")  # fmt: skip
    assert (gain >= -MARGIN_TOLERANCE * crown.margins[todo].abs().clamp(min=1)).all()


def alpha_crown_margins(graph, prop, where: torch.Tensor, config: dict) -> torch.Tensor:
    """alpha-CROWN's margin bound on the images ``where``; none may be falsified (its
    box-PGD breaking what ``standard`` left is printed, then fails)."""
    if not where.any():
        return torch.empty(0)
    began = time.process_time()
    result = AlphaCrownVerifier(config).verify(graph, prop[where])
    print(
        f"\nalpha-CROWN on images {where.nonzero().flatten().tolist()}: "
        f"{sorted(Counter(result.verdicts).items())}, {time.process_time() - began:.0f} CPU s; "
        f"margins {[round(m, 4) for m in result.margins.tolist()]}"
    )
    assert not result.falsified.any()
    return result.margins


# The two runs bound the same boxes in different batches; a per-row rounding margin or a
# chunk boundary may move the last float32 digits (resnet_2b at 1/255: alpha-CROWN's margin
# was above CROWN's by at least 9e-4 on every image)
MARGIN_TOLERANCE = 1e-5


def report(name, eps, published, crown, alpha, todo, broken, cpu, peak) -> None:
    """Counts with their 95% Clopper-Pearson interval beside the published figure, CPU per
    stage, peak RSS and every image's CROWN margin bound."""
    k = int(crown.certified.sum())
    low, high = clopper_pearson(k, len(crown))
    print(
        f"\n{name} eps {eps}/255: CROWN {k}/100 (95% CI [{low:.1%}, {high:.1%}]), alpha-CROWN "
        f"{int(alpha.sum())}/100, standard attack leaves {int((~broken).sum())}/100; published "
        f"CROWN/DeepPoly {published}% (full test set); peak RSS {peak:.2f} GiB; CPU s: CROWN "
        f"{cpu[1] - cpu[0]:.0f}, standard {cpu[2] - cpu[1]:.0f}, "
        f"alpha-CROWN {cpu[3] - cpu[2]:.0f}; "
        f"alpha-CROWN certified {todo.nonzero().flatten()[alpha].tolist()}\n"
        f"CROWN verdicts {sorted(Counter(crown.verdicts).items())}; CROWN margins "
        f"{[round(m, 4) for m in crown.margins.tolist()]}"
    )
