"""``aisafety serve`` of a channels-last ONNX graph taking 0..255 pixels (the shared data's
Keras CNN): it had no --layout or --scale, so it served input [32, 32, 3] and every client
sending (C, H, W) images was refused, told to set 'layout: nhwc', which a remote model
cannot take."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
import torch
from torch import nn

from aisafety.cli import main
from aisafety.errors import ConfigError
from aisafety.prediction import server


class _ChannelsLast(nn.Module):
    """A Keras-style classifier: (N, H, W, C) images in 0..255."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4 * 4 * 3, 5)

    def forward(self, x):
        return self.linear(x.permute(0, 3, 1, 2).flatten(1) / 255)


@pytest.fixture(scope="module")
def keras_like(tmp_path_factory):
    path = tmp_path_factory.mktemp("onnx") / "nhwc.onnx"
    net = _ChannelsLast().eval()
    torch.onnx.export(net, (torch.rand(1, 4, 4, 3),), path, input_names=["input"],
                      dynamic_axes={"input": {0: "batch"}}, dynamo=False)  # fmt: skip
    return path, net


def test_serve_takes_layout_and_scale_for_a_channels_last_graph(keras_like, monkeypatch):
    path, net = keras_like
    served = []
    monkeypatch.setattr(server, "serve", lambda predictor, *_, **__: served.append(predictor))
    assert main(["serve", str(path), "--layout", "nhwc", "--scale", "255", "--quiet"]) == 0
    (predictor,) = served
    assert tuple(predictor.input_shape) == (3, 4, 4)  # what clients send, as the platform
    x = torch.rand(3, 3, 4, 4)
    expected = net(x.permute(0, 2, 3, 1) * 255)
    torch.testing.assert_close(predictor.logits(x), expected, rtol=1e-5, atol=1e-5)


def test_layout_is_refused_for_a_model_that_is_not_onnx():
    with pytest.raises(ConfigError, match="--layout nhwc applies to ONNX files only"):
        server.open_model("mnist-cnn", layout="nhwc")


def test_a_remote_channels_last_model_is_told_to_serve_with_layout(keras_like):
    """It was told to set 'layout: nhwc', which a remote model does not take."""
    from aisafety.errors import InputError
    from aisafety.prediction.remote import RemotePredictor

    path, _ = keras_like
    with server.make_server(server.open_model(str(path)), port=0, model_name="k") as served:
        remote = RemotePredictor(served.url, "k")
        with pytest.raises(InputError) as caught:
            remote.check_input_layout(torch.rand(2, 3, 4, 4))
    message = str(caught.value)
    assert "aisafety serve MODEL.onnx --layout nhwc" in message and "--scale 255" in message
    assert "layout: nhwc" not in message and "input_shape [" not in message


def test_an_explicit_input_shape_the_server_reads_channels_last_is_refused(keras_like, tmp_path):
    """input_shape [3, 4, 4] on a server reading [4, 4, 3] ran: the element counts match, so
    the (C, H, W) values went out labelled (H, W, C) and reached the model scrambled (its
    logits differed from the network's on the same images; ca was stored)."""
    import aisafety

    path, _ = keras_like
    with server.make_server(server.open_model(str(path)), port=0, model_name="k") as served:
        model = {"name": "k", "source": "remote", "url": served.url, "input_shape": [3, 4, 4]}
        plan = {"model": model, "metrics": ["ca"]}
        with pytest.raises(ConfigError) as caught:
            aisafety.evaluate(plan, f"sqlite:///{tmp_path}/r.db", data=_images())
    message = str(caught.value)
    assert "input_shape [3, 4, 4]" in message and "server's input [4, 4, 3]" in message
    assert "scrambled" in message and "aisafety serve MODEL.onnx --layout nhwc" in message


def _images():
    return torch.rand(6, 3, 4, 4), torch.arange(6) % 5


def _infer(url: str, shape: list[int], values: torch.Tensor) -> tuple[int, dict]:
    data = values.flatten().tolist()
    tensor = {"name": "input", "shape": shape, "datatype": "FP32", "data": data}
    request = urllib.request.Request(
        url, json.dumps({"inputs": [tensor]}).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_server_refuses_values_sent_in_another_order(keras_like):
    """A client that skipped the metadata and sent channels-last [N, 4, 4, 3] images to a
    server reading [N, 3, 4, 4] got 200 and the logits of scrambled images (the counts
    matched, the server reshaped). Shapes holding the values in the model's order (flat, a
    split or merged neighbour, a size-1 axis) still answer, with the same logits."""
    from aisafety.prediction.remote import RemotePredictor

    path, _ = keras_like
    predictor = server.open_model(str(path), layout="nhwc")  # reads (C, H, W) = (3, 4, 4)
    x = torch.rand(2, 3, 4, 4)
    expected = predictor.logits(x).flatten().tolist()
    with server.make_server(predictor, port=0, model_name="k") as served:
        url = f"{served.url}/v2/models/k/infer"
        for shape in ([2, 3, 4, 4], [2, 48], [2, 3, 16], [2, 12, 4], [2, 1, 3, 4, 4]):
            status, body = _infer(url, shape, x)
            assert status == 200, (shape, body)
            assert body["outputs"][0]["data"] == pytest.approx(expected, abs=1e-6), shape
        status, body = _infer(url, [2, 4, 4, 3], x.permute(0, 2, 3, 1))
        assert status == 400
        assert "input shape [2, 4, 4, 3]" in body["error"] and "[N, 3, 4, 4]" in body["error"]
        assert "channels-last" in body["error"] and "x.transpose(0, 3, 1, 2)" in body["error"]
        status, body = _infer(url, [2, 4, 12], x)  # H before C: cut where (C, H, W) is not
        assert status == 400 and "another order" in body["error"], body
        assert "send [N, 3, 4, 4], or the same values flat as [N, 48]" in body["error"]
        # our own client reads the metadata, or sends (C, H, W) when told everything
        told = RemotePredictor(served.url, "k", (3, 4, 4), 5, input_name="input")
        for remote in (RemotePredictor(served.url, "k"), told):
            assert remote.logits(x).flatten().tolist() == pytest.approx(expected, abs=1e-6)
        assert told.requests_sent == 1  # no metadata read


@pytest.mark.parametrize(
    ("shape", "wire", "same"),
    [
        ((1, 28, 28), (784,), True),  # flat
        ((1, 28, 28), (28, 28), True),  # a size-1 channel dropped
        ((1, 28, 28), (28, 28, 1), True),  # one channel: channels-last is the same order
        ((3, 32, 32), (3, 1024), True),  # H and W merged
        ((3, 32, 32), (1, 3, 32, 32), True),
        ((3, 32, 32), (32, 32, 3), False),  # channels-last
        ((3, 32, 32), (32, 96), False),  # cuts where (C, H, W) does not
    ],
)
def test_which_wire_shapes_keep_the_order(shape, wire, same):
    from aisafety.prediction.remote import same_order

    assert same_order(shape, wire) is same
