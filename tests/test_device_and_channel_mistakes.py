"""Two user mistakes whose errors gave the wrong fix: a grey model fed colour images (or the
reverse) was told to 'add a batch dimension or resize the images', and a forward calling
``.cuda()`` on a machine without CUDA was told to 'check input_shape'."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aisafety.errors import ConfigError, InputError, ModelOutputError
from aisafety.interfaces import ModelSpec
from aisafety.loading import load_model
from aisafety.prediction.torch_module import TorchPredictor


def _net(channels: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(channels, 2, 3), nn.Flatten(), nn.Linear(2 * 6 * 6, 10))


@pytest.mark.parametrize("model_channels, image_channels", [(1, 3), (3, 1)])
def test_a_channel_mismatch_is_named_as_one(model_channels, image_channels):
    predictor = TorchPredictor(_net(model_channels), (model_channels, 8, 8), 10, name="m")
    with pytest.raises(InputError) as error:
        predictor.logits(torch.rand(2, image_channels, 8, 8))
    message = str(error.value)
    assert f"images have {image_channels} channel(s) and the model takes {model_channels}:" in (
        message
    )
    assert "resize" not in message


def test_a_wrong_image_size_still_says_resize():
    """The other way out names images of the model's size; it said "an imagefolder
    dataset" to a user whose imagefolder held the wrong size (session 21)."""
    predictor = TorchPredictor(_net(3), (3, 8, 8), 10, name="m")
    with pytest.raises(InputError, match="resize the images") as error:
        predictor.logits(torch.rand(2, 3, 9, 9))
    assert "an imagefolder or npz dataset of 8x8 images" in str(error.value)


class OnCuda(nn.Module):
    """A forward that moves its input to CUDA (from batch ``above`` on)."""

    def __init__(self, above: int = 0) -> None:
        super().__init__()
        self.net, self.above = _net(3), above

    def forward(self, x):
        return self.net(x.cuda() if len(x) > self.above else x)


no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")


@no_cuda
def test_a_forward_moving_tensors_to_cuda_is_named_at_load():
    spec = ModelSpec(name="c", source="python", factory=f"{__name__}:OnCuda",
                     input_shape=(3, 8, 8))  # fmt: skip
    with pytest.raises(ConfigError) as error:
        load_model(spec, torch.device("cpu"))
    assert "moves tensors to CUDA and no CUDA GPU is visible" in str(error.value)
    assert "check input_shape" not in str(error.value)


@no_cuda
def test_a_forward_moving_tensors_to_cuda_is_named_on_a_batch():
    predictor = TorchPredictor(OnCuda(above=1), (3, 8, 8), 10, name="c")
    with pytest.raises(ModelOutputError) as error:
        predictor.logits(torch.rand(2, 3, 8, 8))
    assert "moves tensors to CUDA and no CUDA GPU is visible" in str(error.value)


@no_cuda
def test_an_export_archive_saved_on_cuda_is_named_with_the_fix(tmp_path, monkeypatch):
    """Its tensors carry the location tag 'cuda:0' (as torch.save writes a CUDA tensor's),
    which torch.export.load cannot map: it said 'is not a torch.export archive'."""
    batch = torch.export.Dim("batch")
    program = torch.export.export(
        _net(3).eval(), (torch.rand(2, 3, 8, 8),), dynamic_shapes=({0: batch},)
    )
    with monkeypatch.context() as patched:
        patched.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        torch.export.save(program, tmp_path / "cuda.pt2")
    spec = ModelSpec(name="c", source="export", path=tmp_path / "cuda.pt2", input_shape=(3, 8, 8))
    with pytest.raises(ConfigError) as error:
        load_model(spec, torch.device("cpu"))
    message = str(error.value)
    assert "was exported on a CUDA device" in message and "model.cpu()" in message
    assert "is not a torch.export archive" not in message


def test_a_wrong_image_size_names_a_resizing_module_that_works(tmp_path):
    """imagenet-samples (224x224, no resize option) on a 299x299 model was told to 'resize the
    images'; the named wrapper with the named input_shape runs."""
    import aisafety

    predictor = TorchPredictor(_Pool299(), (3, 299, 299), 10, name="m")
    with pytest.raises(InputError) as caught:
        predictor.logits(torch.rand(2, 3, 224, 224))
    message = str(caught.value)
    assert "the images are 224x224 and the model takes 299x299" in message
    assert "nn.Upsample(size=(299, 299), mode='bilinear'), net)" in message
    assert "input_shape [3, 224, 224]" in message
    wrapped = nn.Sequential(nn.Upsample(size=(299, 299), mode="bilinear"), _Pool299())
    data = (torch.rand(2, 3, 224, 224), torch.zeros(2, dtype=torch.int64))
    plan = {"dataset": {"limit": 2}, "metrics": ["ca"], "attacks": [{"name": "fgsm"}]}
    record = aisafety.evaluate(plan, f"sqlite:///{tmp_path}/a.db", model=wrapped, data=data)
    assert record.values and not record.failed_units


class _Pool299(nn.Module):
    """An Inception-shaped input: refuses anything but 299x299."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 10)

    def forward(self, x):
        assert tuple(x.shape[2:]) == (299, 299)
        return self.fc(x.mean(dim=(2, 3)))


def colour_net() -> nn.Module:
    return _net(3)


def test_a_channels_last_input_shape_is_answered_with_the_channels_first_one():
    """`input_shape: [8, 8, 3]` for a module was told only to 'check input_shape'; the
    message now says a module is fed (C, H, W) and gives the shape to write, which loads."""
    spec = ModelSpec(name="m", source="python", factory=f"{__name__}:colour_net",
                     input_shape=(8, 8, 3))  # fmt: skip
    with pytest.raises(ConfigError) as error:
        load_model(spec, torch.device("cpu"))
    assert "(8, 8, 3) reads as channels-last: write [3, 8, 8]" in str(error.value)
    predictor, _ = load_model(
        spec.model_copy(update={"input_shape": (3, 8, 8)}), torch.device("cpu")
    )
    assert predictor.num_classes == 10
    with pytest.raises(ValueError, match=r"needs 'input_shape' \(one image's \(C, H, W\): "
                       r"\[3, 32, 32\] for CIFAR-10.*\[3, 224, 224\] for ImageNet"):  # fmt: skip
        ModelSpec(name="m", source="python", factory=f"{__name__}:colour_net")


def test_layout_on_a_module_names_the_wrapper_not_only_its_removal():
    """`layout: nhwc` (an ONNX graph's setting) on a python model said only "remove it",
    which leaves a channels-last module failing; the message names the wrapper."""
    with pytest.raises(ValueError, match=r"remove it: a module is fed \(N, C, H, W\) batches; "
                       r"wrap one .* net\(x.permute\(0, 2, 3, 1\)\)"):  # fmt: skip
        ModelSpec(name="m", source="python", factory=f"{__name__}:colour_net",
                  input_shape=(3, 8, 8), layout="nhwc")  # fmt: skip


@pytest.mark.parametrize("cuda_build", [None, "12.8"])
def test_device_cuda_without_a_gpu_names_the_setting_and_the_cause(monkeypatch, cuda_build):
    """`device: cuda` on a CPU-only torch said only "use 'cpu'" (session 21, an ImageNet
    user's audit): not which setting, nor that the build, not a driver, was the cause."""
    from aisafety.loading import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", cuda_build)
    with pytest.raises(ConfigError) as error:
        resolve_device("cuda")
    message = str(error.value)
    assert "device: cpu" in message and "--device cpu" in message and "auto" in message
    assert ("CPU-only build" in message) == (cuda_build is None)
    assert resolve_device("auto") == torch.device("cpu")
