"""CROWN on the VNN-COMP 2021 CIFAR ResNets, ours beside auto_LiRPA's, image by image.

    /work/venv-lirpa/bin/python bench/resnet_crown_lirpa.py resnet_4b --eps 1 [--images 100]
                                [--first 0] [--only I ...] [--no-ours] [--precision float64]
                                [--alpha [--search-work W]]

``--alpha``: alpha-CROWN instead, auto_LiRPA's ``CROWN-Optimized`` with its defaults
(20 iterations, lr 0.5, intermediate bounds CROWN's: ``fix_interm_bounds``) beside ours
(``alpha-crown``'s bound without its attack; ``--search-work``: its ``search_work``).

Both bound the same 100 shipped CIFAR-10 test images (``eran_test_subsets``, x/255) on the
same box, ``[x - eps, x + eps]`` clipped to [0, 1] in pixel space and then normalised with
the benchmark's mean/std (data README section 6), with the margin rows ``f_y - f_j`` as the
spec. auto_LiRPA (a separate venv, see bench/bound_speed.py) bounds a plain torch module
built here from the ONNX graph's Conv/Relu/Add/Flatten/Gemm nodes (checked against
onnxruntime); ours bounds the ONNX model as ``aisafety`` loads it. Prints per image the
lowest margin bound of each and which images each certifies, then the counts and the
largest gap between the two bounds. Run one thread; say the load beside it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from shared_location import shared_data  # noqa: E402

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2471, 0.2435, 0.2616)


def resnet_folder() -> Path:
    """The VNN-COMP 2021 CIFAR-10 ResNets in shared/data."""
    return shared_data("cifar10-models") / "vnncomp2021_cifar10_resnet"


class OnnxResNet(nn.Module):
    """The ONNX graph's nodes, run in order, as standard torch layers auto_LiRPA traces."""

    def __init__(self, path: Path):
        import onnx
        from onnx import numpy_helper

        super().__init__()
        model = onnx.load(str(path))
        weights = {
            i.name: torch.from_numpy(numpy_helper.to_array(i).copy())
            for i in model.graph.initializer
        }
        self.steps: list[tuple[str, list[str], str, int]] = []
        self.layers = nn.ModuleList()
        for node in model.graph.node:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            layer = -1
            if node.op_type in ("Conv", "Gemm"):
                w, bias = weights[node.input[1]], weights[node.input[2]]
                if node.op_type == "Conv":
                    module = nn.Conv2d(
                        w.shape[1],
                        w.shape[0],
                        tuple(w.shape[2:]),
                        tuple(attrs["strides"]),
                        tuple(attrs["pads"][:2]),
                    )
                else:
                    assert attrs.get("transB") == 1
                    module = nn.Linear(w.shape[1], w.shape[0])
                module.weight.data, module.bias.data = w.float(), bias.float()
                self.layers.append(module)
                layer = len(self.layers) - 1
            self.steps.append((node.op_type, list(node.input), node.output[0], layer))
        self.input, self.output = model.graph.input[0].name, model.graph.output[0].name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        env = {self.input: x}
        for kind, inputs, out, layer in self.steps:
            if layer >= 0:
                env[out] = self.layers[layer](env[inputs[0]])
            elif kind == "Relu":
                env[out] = F.relu(env[inputs[0]])
            elif kind == "Add":
                env[out] = env[inputs[0]] + env[inputs[1]]
            elif kind == "Flatten":
                env[out] = torch.flatten(env[inputs[0]], 1)
            else:
                raise SystemExit(f"node {kind} not supported here")
        return env[self.output]


def cifar_images(index: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    data = np.loadtxt(shared_data("eran_test_subsets") / "cifar10_test.csv", delimiter=",")[index]
    x = torch.tensor(data[:, 1:] / 255.0, dtype=torch.float32).reshape(-1, 32, 32, 3)
    return x.permute(0, 3, 1, 2).contiguous(), torch.tensor(data[:, 0], dtype=torch.long)


def lirpa_bounds(
    module: nn.Module, prop, batch: int, method: str = "CROWN"
) -> tuple[float, torch.Tensor]:
    """auto_LiRPA's ``method`` lower bound of every margin row, box normalised outside."""
    from auto_LiRPA import BoundedModule, BoundedTensor
    from auto_LiRPA.perturbations import PerturbationLpNorm

    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    bounded = BoundedModule(module, torch.zeros(1, 3, 32, 32), device="cpu", verbose=False)
    start, rows = time.process_time(), []
    for i in range(0, prop.lower.shape[0], batch):
        lo = (prop.lower[i : i + batch].float() - mean) / std
        hi = (prop.upper[i : i + batch].float() - mean) / std
        x = BoundedTensor((lo + hi) / 2, PerturbationLpNorm(x_L=lo, x_U=hi))
        with torch.no_grad() if method == "CROWN" else torch.enable_grad():
            bound, _ = bounded.compute_bounds(
                x=(x,), C=prop.spec[i : i + batch].float(), method=method, bound_upper=False
            )
        rows.append(bound.detach())
    return time.process_time() - start, torch.cat(rows)


def our_bounds(
    name: str, prop, batch: int, precision: str, alpha: dict | None = None
) -> tuple[float, torch.Tensor]:
    from aisafety.prediction.onnx_model import load_onnx
    from aisafety.verification import rounding
    from aisafety.verification.graph import build_graph
    from aisafety.verification.incomplete import AlphaCrownVerifier, CrownVerifier

    predictor = load_onnx(
        resnet_folder() / f"{name}.onnx", gradients=True, mean=MEAN, std=STD, name=name
    )
    graph = build_graph(predictor.network, predictor.input_shape, name)
    verifier, rows = (CrownVerifier() if alpha is None else AlphaCrownVerifier(alpha)), []
    verifier.prepare()
    start = time.process_time()
    with torch.no_grad(), rounding.pass_precision(precision):
        for i in range(0, prop.lower.shape[0], batch):
            bound, _ = verifier.lower_bounds(graph, prop[i : i + batch].to(graph.dtype))
            rows.append(bound.double())
    return time.process_time() - start, torch.cat(rows)


def main() -> None:
    from aisafety.verification.property import robustness_property

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("net", choices=["resnet_2b", "resnet_4b"])
    parser.add_argument("--eps", type=float, default=1.0, help="in 1/255 pixel units")
    parser.add_argument("--images", type=int, default=100)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--only", type=int, nargs="*", help="these image indices instead")
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--no-ours", action="store_true", help="auto_LiRPA only")
    parser.add_argument("--alpha", action="store_true", help="alpha-CROWN, not CROWN")
    parser.add_argument("--search-work", type=float, help="ours: alpha-crown's search_work")
    parser.add_argument(
        "--precision",
        default="auto",
        help="ours: auto (float32 passes and their rounding "
        "margin, as shipped) or float64 (every pass in float64)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    index = args.only or list(range(args.first, args.first + args.images))
    x, y = cifar_images(index)
    module = OnnxResNet(resnet_folder() / f"{args.net}.onnx").eval()
    check_against_onnxruntime(module, x, args.net)
    clean = module((x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1))
    correct = clean.argmax(1) == y
    prop = robustness_property(x, y, args.eps / 255, 10)
    method = "CROWN-Optimized" if args.alpha else "CROWN"
    theirs_s, theirs = lirpa_bounds(module, prop, args.batch, method)
    theirs = theirs.double().amin(1)
    alpha = None
    if args.alpha:
        alpha = {} if args.search_work is None else {"search_work": args.search_work}
    ours_s, ours = (
        (0.0, None)
        if args.no_ours
        else our_bounds(args.net, prop, args.batch, args.precision, alpha)
    )
    ours = None if ours is None else ours.amin(1)
    for i in range(len(y)):
        mine = "" if ours is None else f" ours {float(ours[i]):9.4f}"
        print(
            f"image {index[i]:3d} correct {int(correct[i])} auto_LiRPA "
            f"{float(theirs[i]):9.4f}{mine}"
        )
    lirpa_ok = (theirs > 0) & correct
    print(
        f"{args.net} eps {args.eps:g}/255, images {index[0]}-{index[-1]} ({len(index)}): "
        f"clean {int(correct.sum())}, auto_LiRPA {method} certified {int(lirpa_ok.sum())} "
        f"({theirs_s:.0f} CPU s): {[index[i] for i in lirpa_ok.nonzero().flatten()]}"
    )
    if ours is not None:
        ours_ok = (ours > 0) & correct
        print(
            f"ours certified {int(ours_ok.sum())} ({ours_s:.0f} CPU s): "
            f"{[index[i] for i in ours_ok.nonzero().flatten()]}; auto_LiRPA's bound "
            f"above ours by at most {float((theirs - ours).max()):.3g}, below by at most "
            f"{float((ours - theirs).max()):.3g}"
        )


def check_against_onnxruntime(module: nn.Module, x: torch.Tensor, name: str) -> None:
    import onnxruntime as ort

    z = (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    session = ort.InferenceSession(
        str(resnet_folder() / f"{name}.onnx"), providers=["CPUExecutionProvider"]
    )
    want = np.concatenate(
        [
            session.run(None, {session.get_inputs()[0].name: z[i : i + 1].numpy()})[0]
            for i in range(min(4, len(z)))
        ]
    )
    got = module(z[: len(want)]).detach().numpy()
    if not np.allclose(got, want, atol=1e-4):
        raise SystemExit(
            f"{name}: torch module differs from onnxruntime by {abs(got - want).max()}"
        )


if __name__ == "__main__":
    main()
