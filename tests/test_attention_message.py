"""A transformer cannot be bounded here (attention multiplies two values computed from the
input); certified-accuracy and verify say so, naming the node, instead of failing at the
first shape computation of its ONNX graph."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from aisafety.cli import main
from aisafety.verification.graph import VerificationError, build_graph

ROOT = Path(__file__).resolve().parents[1]
VIT = next(
    (p / "cifar10-models" / "vnncomp2023_vit" / "pgd_2_3_16.onnx"
     for p in (ROOT.parent / "shared" / "data", ROOT.parents[1] / "shared" / "data")
     if (p / "cifar10-models" / "vnncomp2023_vit" / "pgd_2_3_16.onnx").is_file()),
    None,
)  # fmt: skip
NORMALISE = {"mean": [0.4914, 0.4822, 0.4465], "std": [0.2023, 0.1994, 0.2010]}


class Attention(nn.Module):
    """One head of self-attention over the 4 rows of a 1x4x6 input."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 6)
        self.head = nn.Linear(24, 3)

    def forward(self, x):
        tokens = x.flatten(1, 2)  # (N, 4, 6)
        scores = torch.matmul(self.q(tokens), self.k(tokens).transpose(1, 2))
        mixed = torch.matmul(torch.softmax(scores, dim=-1), self.v(tokens))
        return self.head(mixed.flatten(1))


class ByConstant(nn.Module):
    """A matmul by a weight: linear in the input, bounded as before."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(24, 3))

    def forward(self, x):
        return torch.matmul(x.flatten(1), self.weight)


def test_the_message_names_the_product_node_and_the_softmax():
    with pytest.raises(VerificationError) as error:
        build_graph(Attention().eval(), (1, 4, 6), "tiny-vit")
    message = str(error.value)
    assert "model 'tiny-vit' cannot be bounded: node 'matmul'" in message
    assert "multiplies two values computed from the input" in message
    assert "1 softmax node(s) (softmax" in message
    assert "certified-accuracy and verify cannot run on this model" in message
    build_graph(ByConstant().eval(), (1, 4, 6), "linear")  # no false alarm


@pytest.mark.skipif(VIT is None, reason="../shared/data/cifar10-models (the ViTs) absent")
def test_certified_accuracy_and_verify_on_the_vnncomp_vit_name_the_attention(tmp_path, capsys):
    model = {"name": "pgd_2_3_16", "source": "onnx", "path": str(VIT), "gradients": True}
    plan = {
        "model": {**model, **NORMALISE},
        "dataset": {"name": "cifar10-embedded", "limit": 2},
        "metrics": [{"name": "certified-accuracy", "config": {"eps": 0.001, "verifier": "ibp"}}],
    }
    path = tmp_path / "vit.yaml"
    path.write_text(yaml.safe_dump(plan))
    assert main(["evaluate", str(path), "--db", f"sqlite:///{tmp_path / 'r.db'}"]) == 2
    message = capsys.readouterr().err
    assert "model 'pgd_2_3_16' cannot be bounded: node '" in message and "(OnnxMatMul)" in message
    assert "2 softmax node(s)" in message and "Traceback" not in message
    lines = [f"(declare-const X_{i} Real)" for i in range(3 * 32 * 32)]
    lines += [f"(declare-const Y_{j} Real)" for j in range(10)]
    for i in range(3 * 32 * 32):
        lines += [f"(assert (>= X_{i} -0.01))", f"(assert (<= X_{i} 0.01))"]
    lines.append("(assert (or " + " ".join(f"(and (>= Y_{j} Y_0))" for j in range(1, 10)) + "))")
    spec = tmp_path / "box.vnnlib"
    spec.write_text("\n".join(lines) + "\n")
    assert main(["verify", str(VIT), str(spec), "--timeout", "20"]) == 2
    message = capsys.readouterr().err
    assert "model 'pgd_2_3_16.onnx' cannot be bounded" in message and "(OnnxMatMul)" in message


class TorchAttention(nn.Module):
    """torch's attention modules, as torchvision's ViT and user transformers use them."""

    def __init__(self, layer: str):
        super().__init__()
        if layer == "MultiheadAttention":
            self.attention = nn.MultiheadAttention(6, 2, batch_first=True)
        else:
            self.attention = nn.TransformerEncoderLayer(6, 2, 12, batch_first=True)
        self.head = nn.Linear(24, 3)

    def forward(self, x):
        tokens = x.flatten(1, 2)  # (N, 4, 6)
        if isinstance(self.attention, nn.MultiheadAttention):
            mixed, _ = self.attention(tokens, tokens, tokens, need_weights=False)
        else:
            mixed = self.attention(tokens)
        return self.head(mixed.flatten(1))


@pytest.mark.parametrize("layer", ["MultiheadAttention", "TransformerEncoderLayer"])
def test_torchs_attention_modules_are_named_as_attention_not_as_untraceable(layer):
    """Their forwards branch on their inputs: fx traced into them and failed with
    'symbolically traced variables cannot be used as inputs to control flow' (session 19)."""
    with pytest.raises(VerificationError) as error:
        build_graph(TorchAttention(layer).eval(), (1, 4, 6), "mha")
    message = str(error.value)
    assert f"node 'attention' ({layer}) multiplies two values computed from" in message
    assert "cannot be traced" not in message
