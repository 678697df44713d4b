"""The SoK Conv-Small cell's PGD-robust samples as VNN-COMP instances, for alpha-beta-CROWN.

    python bench/abcrown/sok_export.py OUT_DIR [--model sok-cnn-a-adv3] [--eps 0.3]
                                       [--samples 0-100] [--count 4]

The cell of ``bench/sok_conv_small.py`` (the 100 images of ``examples/sok-mnist.yaml``,
PGD-100 with step eps / 50, true labels): the zoo model's layers after its input
normalisation as ``OUT_DIR/model.onnx`` (the TorchScript exporter; onnxruntime on the
normalised image checked against the whole model; alpha-beta-CROWN's branching fails on a
Sub/Div in front of the first convolution), and for the first ``--count``
samples of ``--samples`` that PGD-100 did not break (the ones the cell sends to the
complete verifier) the L-inf box (clipped to [0, 1]) and the property "the label's logit
stays above every other" as ``sample_N.vnnlib``, listed in ``OUT_DIR/instances.csv``. Then
``bench/abcrown/run.py --suite sok --csv OUT_DIR/instances.csv`` verifies them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def vnnlib_text(
    x: torch.Tensor, label: int, eps: float, classes: int, mean: float, std: float
) -> str:
    """VNN-COMP's robustness property: the box, and a violation is any logit >= the label's.
    The box is written after the model's input normalisation ((x - mean) / std, exact: the
    map is monotone and one to one), which the exported network leaves out."""
    flat = x.reshape(-1).double()
    lower, upper = (flat - eps).clamp(0, 1), (flat + eps).clamp(0, 1)
    lower, upper = (lower - mean) / std, (upper - mean) / std
    lines = [f"(declare-const X_{i} Real)" for i in range(len(flat))]
    lines += [f"(declare-const Y_{j} Real)" for j in range(classes)]
    for i, (lo, hi) in enumerate(zip(lower.tolist(), upper.tolist(), strict=True)):
        lines += [f"(assert (<= X_{i} {hi!r}))", f"(assert (>= X_{i} {lo!r}))"]
    others = " ".join(f"(and (>= Y_{j} Y_{label}))" for j in range(classes) if j != label)
    lines.append(f"(assert (or {others}))")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", default="sok-cnn-a-adv3")
    parser.add_argument("--eps", type=float, default=0.3)
    parser.add_argument("--samples", default="0-100")
    parser.add_argument("--count", type=int, default=4)
    args = parser.parse_args()
    import onnxruntime as ort
    from sok_conv_small import cell_data

    from aisafety.attack.pgd import PGDLinf
    from aisafety.database.zoo import load_zoo_model

    torch.set_num_threads(1)
    x, y = cell_data()
    model = load_zoo_model(args.model)
    adv = PGDLinf({"steps": 100, "step_size": args.eps / 50})(model, x, y, args.eps).x_adv
    with torch.no_grad():
        robust = model.logits(adv).argmax(1) == y
    args.out.mkdir(parents=True, exist_ok=True)
    onnx_path = args.out / "model.onnx"
    normalize, net = model.network.eval()  # Normalize, then the layers
    mean, std = float(normalize.mean), float(normalize.std)
    torch.onnx.export(net, x[:1], onnx_path, dynamo=False, input_names=["x"])
    session = ort.InferenceSession(str(onnx_path))
    with torch.no_grad():
        error = max(
            abs(
                session.run(None, {"x": ((x[i : i + 1] - mean) / std).numpy()})[0]
                - model.network(x[i : i + 1]).numpy()
            ).max()
            for i in range(8)
        )
    assert error < 1e-4, f"the exported model differs from the zoo's by {error}"
    first, last = (int(v) for v in args.samples.split("-"))
    chosen = [s for s in range(first, min(last, len(y))) if robust[s]][: args.count]
    rows = []
    for s in chosen:
        spec = args.out / f"sample_{s}.vnnlib"
        spec.write_text(vnnlib_text(x[s], int(y[s]), args.eps, model.num_classes, mean, std))
        rows.append(f"model.onnx,{spec.name}")
    (args.out / "instances.csv").write_text("\n".join(rows) + "\n")
    print(f"{args.model} at {args.eps}: PGD-100 robust {int(robust.sum())}/{len(y)}; "
          f"wrote samples {chosen} to {args.out} (onnx vs zoo {error:.1e})")  # fmt: skip


if __name__ == "__main__":
    main()
