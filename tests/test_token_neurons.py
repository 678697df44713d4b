"""Neurons of token layers: on a (N, T, D) output of a linear, norm or transformer layer the
neurons are the D hidden units, each averaged over the T tokens. Before session 18 the tokens
were read as neurons (each averaged over the hidden units): a ViT's coverage, sensitivity
and uncertainty were computed on the wrong units without any error."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from aisafety.database.datasets.base import LoadedDataset
from aisafety.errors import ConfigError
from aisafety.evaluation.features import extract_features
from aisafety.evaluation.neuron_layout import channels_last
from aisafety.evaluation.neurons import NeuronArtifacts, neuron_deviation, neuron_outputs
from aisafety.prediction.footprint import activations_bytes
from aisafety.prediction.torch_module import TorchPredictor


class Tokens(nn.Module):
    """Input (1, 2, 3): two tokens of three values. ``lin`` scales the hidden units by
    (1, 2, -1) and adds (0, 0, 0.5); ``act`` is a ReLU after it, on the same units."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.act = nn.ReLU()
        self.head = nn.Linear(3, 2)
        with torch.no_grad():
            self.lin.weight.copy_(torch.diag(torch.tensor([1.0, 2.0, -1.0])))
            self.lin.bias.copy_(torch.tensor([0.0, 0.0, 0.5]))

    def forward(self, x):
        return self.head(self.act(self.lin(x.reshape(len(x), 2, 3))).mean(1))


X = torch.tensor([[[[0.2, 0.4, 0.6], [0.4, 0.0, 0.9]]], [[[1.0, 1.0, 0.0], [0.0, 0.5, 0.5]]]])


def predictor() -> TorchPredictor:
    return TorchPredictor(Tokens().eval(), (1, 2, 3), 2, name="tokens")


def test_a_token_layers_neurons_are_its_hidden_units_averaged_over_tokens():
    # lin per token: (x0, 2 x1, .5 - x2). Image 0: (.2, .8, -.1), (.4, 0, -.4);
    # image 1: (1, 2, .5), (0, 1, 0). Means over the two tokens, per unit:
    lin = [[0.3, 0.4, -0.25], [0.5, 1.5, 0.25]]
    act = [[0.3, 0.4, 0.0], [0.5, 1.5, 0.25]]  # the ReLU before the mean
    values, sizes = neuron_outputs(predictor(), X, ("lin", "act"), batch_size=1)
    assert sizes == (3, 3)  # three hidden units each, not two tokens
    torch.testing.assert_close(values, torch.tensor([u + v for u, v in zip(lin, act, strict=True)]))


def test_a_token_layers_sensitivity_is_per_hidden_unit_over_tokens():
    # |lin(x) - lin(1 - x)| per token: (|2 x0 - 1|, 2 |2 x1 - 1|, |2 x2 - 1|).
    # Image 0: (.6, .4, .2), (.2, 2, .8); image 1: (1, 2, 1), (1, 0, 0). Means per unit:
    (deviation,) = neuron_deviation(predictor(), X, 1 - X, ("lin",), batch_size=1)
    torch.testing.assert_close(deviation, torch.tensor([[0.4, 1.2, 0.5], [1.0, 1.0, 0.5]]))


class Mixed(nn.Module):
    """A conv stem, a ConvNeXt-like channels-last block, and a transformer block."""

    def __init__(self, batch_first: bool = True):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 1)
        self.relu = nn.ReLU()
        self.norm = nn.LayerNorm(4)
        self.gelu = nn.GELU()
        self.drop = nn.Dropout(0.0)
        self.block = nn.TransformerEncoderLayer(4, 2, 8, 0.0, batch_first=batch_first)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        hidden = self.drop(self.gelu(self.norm(self.relu(self.conv(x)).permute(0, 2, 3, 1))))
        tokens = hidden.flatten(1, 2)
        if not self.block.self_attn.batch_first:
            return self.head(self.block(tokens.transpose(0, 1)).mean(0))
        return self.head(self.block(tokens).mean(1))


def test_the_layout_comes_from_the_layer_type_and_an_activation_from_the_layer_before_it():
    module = Mixed().eval()
    layers = ("conv", "relu", "norm", "gelu", "drop", "block", "block.linear1", "block.norm2")
    with torch.no_grad():
        layouts = channels_last(module, layers, lambda: module(torch.rand(1, 1, 2, 2)))
    assert layouts == (False, False, True, True, True, True, True, True)
    assert channels_last(None, ("conv", "norm"), lambda: None) == (False, False)


class SharedReluLast(nn.Module):
    """A CNN that registers its one ReLU after its head and calls it last on a conv map."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 1)
        self.head = nn.Linear(3, 2)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.head(self.relu(self.conv(x)).mean((2, 3)))


def test_an_activation_takes_the_layout_of_the_layer_called_before_it_not_registered():
    module = SharedReluLast().eval()
    with torch.no_grad():
        assert channels_last(module, ("relu",), lambda: module(torch.rand(1, 1, 2, 2))) == (False,)
    model = TorchPredictor(module, (1, 2, 2), 2, name="shared-relu")
    x = torch.rand(2, 1, 2, 2)
    values, sizes = neuron_outputs(model, x, ("relu",), batch_size=2)
    assert sizes == (3,)  # the three channels, not the two columns of the map
    with torch.no_grad():
        torch.testing.assert_close(values, module.relu(module.conv(x)).mean((2, 3)))


def test_conv_and_channels_last_layers_side_by_side():
    x = torch.rand(3, 1, 2, 2)
    torch.manual_seed(0)
    model = TorchPredictor(Mixed().eval(), (1, 2, 2), 2, name="mixed")
    values, sizes = neuron_outputs(model, x, ("relu", "gelu", "block"), batch_size=2)
    assert sizes == (4, 4, 4)
    with torch.no_grad():
        relu = model.module.relu(model.module.conv(x))  # (3, 4, 2, 2): channels first
        gelu = model.module.gelu(model.module.norm(relu.permute(0, 2, 3, 1)))  # (3, 2, 2, 4)
        block = model.module.block(gelu.flatten(1, 2))  # (3, 4 tokens, 4 units)
    want = torch.cat([relu.mean((2, 3)), gelu.mean((1, 2)), block.mean(1)], 1)
    torch.testing.assert_close(values, want)


def test_a_sequence_first_transformer_is_refused_not_read_as_the_batch():
    model = TorchPredictor(Mixed(batch_first=False).eval(), (1, 2, 2), 2, name="seq-first")
    with pytest.raises(ConfigError, match=r"layer 'block'.*does not start with the batch"):
        neuron_outputs(model, torch.rand(3, 1, 2, 2), ("block",), batch_size=3)


def test_a_sequence_first_layer_is_refused_as_a_feature_layer_too():
    """RDI/ROBY flatten the layer's output per image: tokens in dim 0 would be read as images
    (4 'feature vectors' for 3 images, beside 3 predicted labels)."""
    model = TorchPredictor(Mixed(batch_first=False).eval(), (1, 2, 2), 2, name="seq-first")
    with pytest.raises(ConfigError, match=r"layer 'block'.*does not start with the batch"):
        extract_features(model, torch.rand(3, 1, 2, 2), "block")


def test_a_runs_layout_pass_runs_once_per_layer_set_and_changes_no_value():
    """The layouts' one-image forward pass (an element-wise layer is watched) ran on every
    outputs, deviation and bounds call: once for the profile data and again per tested set.
    The run's neuron cache finds it once per layer set; the values are those of the uncached
    functions, bit for bit."""
    torch.manual_seed(0)
    model = TorchPredictor(Mixed().eval(), (1, 2, 2), 2, name="mixed")
    x, adv, profile = (torch.rand(4, 1, 2, 2) for _ in range(3))
    layers = ("relu", "gelu", "block")
    activations_bytes(model)  # the memory probe's one-image pass, kept on the predictor
    one_image = []  # now the layout pass is the only one-image call: the batches hold 4 or 8
    model.module.register_forward_pre_hook(lambda _, args: one_image.append(len(args[0]) == 1))
    data = LoadedDataset("profile", profile, torch.zeros(4, dtype=torch.long), ("a", "b"))
    artifacts = NeuronArtifacts(model, 4, lambda: data)
    bounds = artifacts.bounds(layers)
    clean = artifacts.outputs(layers, "clean", x)
    attacked = artifacts.outputs(layers, "adv", adv)
    deviation = artifacts.deviation(layers, "adv", x, adv)
    assert sum(one_image) == 1
    assert torch.equal(bounds.low, neuron_outputs(model, profile, layers, 4)[0].amin(0))
    assert torch.equal(clean, neuron_outputs(model, x, layers, 4)[0])
    assert torch.equal(attacked, neuron_outputs(model, adv, layers, 4)[0])
    for got, want in zip(deviation, neuron_deviation(model, x, adv, layers, 4), strict=True):
        assert torch.equal(got, want)
    assert sum(one_image) == 1 + 4  # each of the four uncached calls runs it


class Attending(nn.Module):
    """Two one-value tokens through one attention head whose projections are all 1 (no
    bias): token i's output is sum_j softmax_j(t_i t_j) t_j."""

    def __init__(self, batch_first: bool = True):
        super().__init__()
        self.attn = nn.MultiheadAttention(1, 1, bias=False, batch_first=batch_first)
        self.lstm = nn.LSTM(1, 1, batch_first=True)
        self.head = nn.Linear(2, 2)
        with torch.no_grad():
            self.attn.in_proj_weight.fill_(1.0)
            self.attn.out_proj.weight.fill_(1.0)

    def forward(self, x):
        tokens = x.reshape(-1, 2, 1)
        if not self.attn.batch_first:
            tokens = tokens.transpose(0, 1)
        out, _ = self.attn(tokens, tokens, tokens)  # a tuple: (output, weights)
        out = out if self.attn.batch_first else out.transpose(0, 1)
        return self.head(self.lstm(out)[0].flatten(1))


PAIR = torch.tensor([[[[0.0, 1.0]]], [[[0.3, 0.3]]]])  # tokens (0, 1) and (.3, .3)
E = math.e / (1 + math.e)  # softmax of scores (0, 1) on its second entry


def attending() -> TorchPredictor:
    return TorchPredictor(Attending().eval(), (1, 1, 2), 2, name="attending")


def test_an_attention_layers_neuron_is_its_output_element_0_over_tokens():
    """``nn.MultiheadAttention`` returns (output, weights): a watched one failed with
    ``'tuple' object has no attribute 'shape'``. Tokens (0, 1): scores (0, 0) and (0, 1), so
    the outputs are 0.5 and e/(1+e); equal tokens attend to themselves."""
    values, sizes = neuron_outputs(attending(), PAIR, ("attn",), batch_size=2)
    assert sizes == (1,)  # one hidden unit, two tokens
    torch.testing.assert_close(values, torch.tensor([[(0.5 + E) / 2], [0.3]]))
    (deviation,) = neuron_deviation(attending(), PAIR, PAIR.flip(0), ("attn",), batch_size=2)
    # |(.5, e/(1+e)) - (.3, .3)| averaged over the two tokens, both ways
    torch.testing.assert_close(deviation, torch.full((2, 1), (0.2 + E - 0.3) / 2))


def test_an_attention_layer_is_a_feature_layer_too_and_sequence_first_is_refused():
    features = extract_features(attending(), PAIR, "attn")
    want = torch.tensor([[0.5, E], [0.3, 0.3]], dtype=torch.float64)  # (tokens x 1 unit)
    torch.testing.assert_close(features.vectors, want)
    seq_first = TorchPredictor(Attending(False).eval(), (1, 1, 2), 2, name="seq-first")
    with pytest.raises(ConfigError, match=r"layer 'attn'.*does not start with the batch"):
        neuron_outputs(seq_first, torch.rand(3, 1, 1, 2), ("attn",), batch_size=3)


def test_another_layer_returning_a_tuple_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"layer 'lstm' \(LSTM\) returns tuple \(Tensor, "):
        neuron_outputs(attending(), PAIR, ("lstm",), batch_size=2)
