"""CROWN and alpha-CROWN on the VNN-COMP 2021 CIFAR ResNets, within the default memory
budget: verified accuracy on the 100 shipped CIFAR-10 test images beside the benchmark's
published CROWN/DeepPoly figures (Wang et al. 2021, full test set), every certified image
robust against the ``standard`` attack, alpha-CROWN at least as high on every image."""

from __future__ import annotations

import resource
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from aisafety.plugins import default_registry
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
    predictor = vnncomp_resnet(name)
    x, y = cifar_images()
    graph = build_graph(predictor.network, predictor.input_shape, name)
    prop = robustness_property(x, y, eps / 255, 10)
    cpu = [time.process_time()]
    crown = CrownVerifier(batch_size=20).verify(graph, prop, predictor.logits).certified
    cpu.append(time.process_time())
    attack = default_registry().create("attack", "standard", {})
    broken = attack(predictor, x, y, eps / 255).success | (predictor.logits(x).argmax(1) != y)
    cpu.append(time.process_time())
    print(f"\n{name} eps {eps}/255: CROWN certified {crown.nonzero().flatten().tolist()}")
    assert not (crown & broken).any()  # a certificate the attack breaks: unsound
    # alpha-CROWN where it can add a certificate or must keep one: every unbroken image
    todo = ~broken
    alpha = torch.zeros_like(crown)
    alpha[todo] = AlphaCrownVerifier(batch_size=20).verify(graph, prop[todo]).certified
    cpu.append(time.process_time())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)
    print(
        f"\n{name} eps {eps}/255: CROWN {crown.float().mean():.0%}, alpha-CROWN "
        f"{alpha.float().mean():.0%}, standard attack {(~broken).float().mean():.0%} of 100 "
        f"images; published CROWN/DeepPoly {published}% (full test set); peak RSS {peak:.2f} GiB; "
        f"CPU s: CROWN {cpu[1] - cpu[0]:.0f}, standard {cpu[2] - cpu[1]:.0f}, "
        f"alpha-CROWN {cpu[3] - cpu[2]:.0f}; alpha-CROWN certified "
        f"{alpha.nonzero().flatten().tolist()}"
    )
    assert (alpha >= crown).all() and not (alpha & broken).any()
