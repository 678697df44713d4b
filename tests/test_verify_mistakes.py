"""`aisafety verify`'s user mistakes (issues 32/33): each is one `error:` line (or a
`warning:` where the evidence is weaker), exit 2, no traceback. A box written for another
input space (`verification/input_space.py`): refused against a range the user declares
(`--scale/--mean/--std`) or the graph's own normalisation gives, warned where only the box
itself or its channel order says so; the real VNN-COMP properties pass (all 306 in
bench/input_space.py, one per benchmark here)."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest
import torch

from aisafety.cli import main
from aisafety.errors import AISafetyWarning
from aisafety.verification.graph import VerificationError
from aisafety.verification.input_space import (
    check_box,
    check_centre_class,
    declared_range,
    graph_range,
)
from aisafety.verification.vnnlib import read_disjuncts
from tests.shared_data import shared_folder

onnx = pytest.importorskip("onnx", reason="onnx is not installed: pip install 'aisafety[onnx]'")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _onnx(
    path, first: list | None = None, inputs: int = 1, dtype=TensorProto.FLOAT, top: int = 0
) -> str:
    """A 4-input, 3-output Gemm net whose bias makes class ``top`` the top class near [0, 1]
    inputs; ``first``: (op, constant) nodes run on its input before the Gemm (an in-graph
    normalisation); ``inputs``: how many graph inputs."""
    rng = np.random.default_rng(0)
    bias = np.zeros(3, np.float32)
    bias[top] = 10.0
    inits = [numpy_helper.from_array(rng.standard_normal((3, 4)).astype(np.float32), "W"),
             numpy_helper.from_array(bias, "b")]  # fmt: skip
    nodes, x = [], "x"
    for k, (op, value) in enumerate(first or []):
        if op == "Cast":  # to float32
            nodes.append(helper.make_node(op, [x], [f"h{k}"], to=TensorProto.FLOAT))
        else:
            inits.append(numpy_helper.from_array(np.array([value], np.float32), f"c{k}"))
            nodes.append(helper.make_node(op, [x, f"c{k}"], [f"h{k}"]))
        x = f"h{k}"
    names = [f"x{k}" if k else "x" for k in range(inputs)]
    for extra in names[1:]:
        nodes.append(helper.make_node("Add", [x, extra], [f"{extra}s"]))
        x = f"{extra}s"
    nodes.append(helper.make_node("Gemm", [x, "W", "b"], ["y"], transB=1))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, dtype, [1, 4]) for n in names],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], inits,
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return str(path)


def _spec(path, centre, eps: float, outputs: int = 3) -> str:
    """A box centre +- eps over len(centre) inputs and the atom Y_1 >= Y_0."""
    lines = [f"(declare-const X_{i} Real)" for i in range(len(centre))]
    lines += [f"(declare-const Y_{j} Real)" for j in range(outputs)]
    lines += [f"(assert (>= X_{i} {c - eps}))\n(assert (<= X_{i} {c + eps}))"
              for i, c in enumerate(centre)]  # fmt: skip
    path.write_text("\n".join([*lines, "(assert (>= Y_1 Y_0))\n"]))
    return str(path)


PIXELS = [0.0, 0.3, 0.8, 1.0]  # an image in [0, 1]
NORMALISED = [(v - 0.1307) / 0.3081 for v in PIXELS]  # the same, as MNIST normalises it


def _error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    out = capsys.readouterr()
    assert out.err.startswith("error: ") and out.err.count("\n") == 1, out.err
    assert "Traceback" not in out.err and not out.out
    return out.err


def test_a_box_outside_a_declared_or_in_graph_range_is_refused_naming_it(tmp_path, capsys):
    plain = _onnx(tmp_path / "plain.onnx")
    own = _onnx(tmp_path / "own.onnx", [("Sub", 0.1307), ("Div", 0.3081)])
    normalised = _spec(tmp_path / "normalised.vnnlib", NORMALISED, 0.02)
    for argv, source in (([plain, normalised, "--scale", "1"], "(--scale 1)"),
                         ([own, normalised], "(its own normalisation (Sub 0.1307, then Div) "
                                             "takes [0, 1])")):  # fmt: skip
        err = _error(capsys, ["verify", *argv, "--verifier", "crown"])
        assert "'normalised.vnnlib': X_0 lies in [-0.4442, -0.4042], outside the network's " \
               f"input range [0, 1] {source}, as do 3 of 4 inputs" in err, err  # fmt: skip
        assert "--scale, --mean and --std" in err
    pixels = _spec(tmp_path / "pixels.vnnlib", PIXELS, 0.01)
    for argv in ([plain, pixels, "--scale", "1"], [own, pixels], [plain, normalised]):
        with warnings.catch_warnings():
            warnings.simplefilter("error", AISafetyWarning)  # nothing says otherwise
            assert main(["verify", *argv, "--verifier", "crown"]) == 0


def test_an_eps_in_0_255_units_is_refused_or_warned_with_its_0_1_value(tmp_path, capsys):
    net = _onnx(tmp_path / "net.onnx")
    wide = _spec(tmp_path / "wide.vnnlib", PIXELS, 8.0)
    err = _error(capsys, ["verify", net, wide, "--scale", "1", "--verifier", "crown"])
    assert "X_0 spans [-8, 8], wider than the network's whole input range [0, 1]" in err
    assert "8 in 0..255 units is 0.03137 in [0, 1]" in err
    said = "VNN-LIB file 'wide.vnnlib': the box's typical half-width 8 exceeds the spread of "
    with pytest.warns(AISafetyWarning, match=re.escape(said + "the values it is centred on (1)")):
        assert main(["verify", net, wide, "--verifier", "crown"]) == 0  # no range known


@pytest.mark.parametrize("declared", [["--mean", "0.5", "--std", "0.25"], ["--scale", "255"]])
def test_a_pixel_box_against_a_wider_declared_range_is_warned(tmp_path, capsys, declared):
    net = _onnx(tmp_path / "net.onnx")
    pixels = _spec(tmp_path / "pixels.vnnlib", PIXELS, 0.01)
    said = "VNN-LIB file 'pixels.vnnlib': the box is centred in [0, 1], a small part of the "
    with pytest.warns(AISafetyWarning, match=re.escape(said + "network's input range")):
        assert main(["verify", net, pixels, *declared, "--verifier", "crown"]) == 0


def test_a_robustness_property_of_another_class_than_the_networks_at_its_centre_is_warned(
    tmp_path,
):
    pixels = _spec(tmp_path / "pixels.vnnlib", PIXELS, 0.01)  # keeps class 0 on top
    said = "VNN-LIB file 'pixels.vnnlib': the network gives class 2 at the box's centre, not "
    said += "class 0, the one the property keeps on top: a misclassified image"
    with pytest.warns(AISafetyWarning, match=re.escape(said)):
        assert (
            main(["verify", _onnx(tmp_path / "n.onnx", top=2), pixels, "--verifier", "crown"]) == 0
        )


def test_declared_values_are_placed_per_channel_in_the_graphs_layout():
    mean, std = [0.5, 0.25], [0.5, 0.25]
    nchw = declared_range([1, 2, 1, 2], 4, None, mean, std)
    assert nchw.lower.tolist() == [-1, -1, -1, -1] and nchw.upper.tolist() == [1, 1, 3, 3]
    nhwc = declared_range(["N", 1, 2, 2], 4, 255.0, [100.0, 50.0], [50.0, 25.0])
    assert nhwc.lower.tolist() == [-2, -2, -2, -2] and nhwc.upper.tolist() == [3.1, 8.2] * 2
    assert declared_range([1, 4], 4) is None
    with pytest.raises(VerificationError, match="--mean has 2 values, but the network's input"):
        declared_range([1, 4], 4, None, mean, std)
    with pytest.raises(VerificationError, match=r"--mean: mean \[128.0\] exceeds 1.*--scale 255"):
        declared_range([1, 4], 4, None, [128.0], [60.0])
    for bad, said in (
        ((0.0, None, None), "--scale must be a positive, finite number, got 0"),
        ((None, [math.nan], None), "--mean must be finite numbers, got [nan]"),
        ((None, None, [0.0]), "--std must be positive, finite numbers, got [0.0]"),
    ):
        with pytest.raises(VerificationError, match=re.escape(said)):  # fmt: skip
            declared_range([1, 4], 4, *bad)


@pytest.mark.parametrize(
    "first, scale",
    [([("Sub", 0.1307), ("Div", 0.3081)], 1.0), ([("Sub", 120.0), ("Mul", 0.02)], 255.0),
     ([("Sub", 0.0), ("Div", 1.0)], None), ([("Div", 0.3081)], None), ([], None)],
)  # fmt: skip
def test_the_graphs_own_normalisation_gives_its_pixel_range(tmp_path, first, scale):
    found = graph_range(_onnx(tmp_path / "n.onnx", first), 4)
    assert (found and float(found.upper[0])) == scale  # mean 0 (ERAN's 9x200): no evidence


def _smooth_image(h: int = 12, w: int = 12) -> torch.Tensor:
    """A (3, h, w) image whose rows change slowly, as a photograph's do."""
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    base = torch.sin(rows / 2.0) + torch.sin(cols / 2.0)
    return torch.stack([base, 0.8 * base + 0.1, 0.5 * base - 0.2]).double()


def test_a_box_in_the_other_channel_order_is_warned():
    image = _smooth_image()
    chw, hwc = image.flatten(), image.permute(1, 2, 0).flatten()
    for centre, shape, warned in (
        (chw, [1, 3, 12, 12], False),
        (hwc, ["N", 12, 12, 3], False),
        (chw, ["N", 12, 12, 3], True),
        (hwc, [1, 3, 12, 12], True),
    ):
        with warnings.catch_warnings(record=True) as caught:  # fmt: skip
            warnings.simplefilter("always")
            check_box(centre - 0.01, centre + 0.01, None, "p.vnnlib", shape)
        assert bool(caught) == warned, (shape, [str(w.message) for w in caught])
        if warned:
            assert caught[0].category is AISafetyWarning
            assert "another network with the same input count" in str(caught[0].message)


SHARED = [
    ("vnncomp2021_mnistfc", "mnist-net_256x2.onnx", "prop_0_0.03.vnnlib", {"scale": 1.0}),
    (
        "vnncomp2021_eran",
        "nets/ffnnSIGMOID__Point_6x200.onnx",
        "specs/mnist/mnist_spec_idx_56_eps_0.01200.vnnlib",
        {"scale": 1.0},
    ),
    (
        "cifar10-models",
        "vnncomp2021_cifar10_resnet/resnet_2b.onnx",
        "vnncomp2021_cifar10_resnet/vnnlib/resnet2b_pgd_filtered__prop_0_eps_0.008.vnnlib",
        {"mean": [0.4914, 0.4822, 0.4465], "std": [0.2471, 0.2435, 0.2616]},
    ),
    (
        "cifar10-models",
        "vnncomp2021_marabou_cifar10/cifar10_small.onnx",
        "vnncomp2021_marabou_cifar10/vnnlib/"
        "networkcifar10_small_index1442_eps0.012_target4_orig3.vnnlib",
        {"scale": 1.0},
    ),
]


@pytest.mark.parametrize("folder, network, spec, declared", SHARED, ids=lambda v: str(v)[:12])
def test_the_vnncomp_properties_pass_as_paired_and_declared(folder, network, spec, declared):
    root = shared_folder(folder)
    shape = [d.dim_value or d.dim_param for d in onnx.load(str(root / network)).graph.input[0]
             .type.tensor_type.shape.dim]  # fmt: skip
    n = int(np.prod([d for d in shape[1:] if isinstance(d, int)]))
    (lower, upper), disjuncts = read_disjuncts(root / spec, n, 10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning fails too
        for known in (graph_range(root / network, n), declared_range(shape, n, **declared)):
            check_box(lower, upper, known, spec, shape)
        check_centre_class(lower, upper, disjuncts, _runtime(root / network), spec)


def _runtime(network):
    """onnxruntime's logits for a batch of one flat input in the network's own layout."""
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(network), providers=["CPUExecutionProvider"])
    graph_input = session.get_inputs()[0]
    shape = [d if isinstance(d, int) and d > 0 else 1 for d in graph_input.shape]

    def logits(x: torch.Tensor) -> torch.Tensor:
        feed = {graph_input.name: x.float().numpy().reshape(shape)}
        return torch.from_numpy(session.run(None, feed)[0]).reshape(1, -1)

    return logits


@pytest.mark.parametrize(
    "argv, said",
    [(["missing.onnx", "p.vnnlib"], "ONNX model 'missing.onnx' does not exist; check the path"),
     (["net.onnx", "missing.vnnlib"], "VNN-LIB file 'missing.vnnlib' does not exist; check"),
     (["net.onnx", "."], "VNN-LIB file '.' is a folder, not a regular file"),
     (["net.onnx", "/dev/null"], "VNN-LIB file '/dev/null' is a character device"),
     (["net.onnx", "net.onnx"], "'net.onnx' is not text (a binary file: a network given as"),
     (["net.onnx", "empty.vnnlib"], "'empty.vnnlib' asserts nothing (empty, or only decl"),
     (["p.vnnlib", "net.onnx"], "the network comes first (aisafety verify NET.onnx SPEC.vnnl"),
     (["two.onnx", "p.vnnlib"], "ONNX model 'two.onnx' has 2 inputs (x, x1); only single-in"),
     (["int.onnx", "p.vnnlib"], "input 'x' is tensor(int64); only float32 inputs are support"),
     (["net.onnx", "ten.vnnlib"], "declares 10 outputs (Y_0 .. Y_9), but network 'net.onnx' "),
     (["net.onnx", "p.vnnlib", "--verifier", "pgd-linf"], "unknown verifier 'pgd-linf'; known "),
     (["net.onnx", "p.vnnlib", "--mean", "0.1", "0.2"], "--mean has 2 values, but the network")],
)  # fmt: skip
def test_a_wrong_invocation_is_one_error_line(tmp_path, monkeypatch, capsys, argv, said):
    monkeypatch.chdir(tmp_path)
    _onnx("net.onnx")
    _onnx("two.onnx", inputs=2)
    _onnx("int.onnx", [("Cast", None)], dtype=TensorProto.INT64)
    _spec(tmp_path / "p.vnnlib", PIXELS, 0.01)
    _spec(tmp_path / "ten.vnnlib", PIXELS, 0.01, outputs=10)
    (tmp_path / "empty.vnnlib").write_text("(declare-const X_0 Real)\n")
    assert said in _error(capsys, ["verify", *argv])


@pytest.mark.parametrize("value", ["-5", "0", "nan", "inf", "abc"])
def test_a_timeout_that_is_not_a_positive_number_of_seconds_is_named(capsys, value):
    with pytest.raises(SystemExit) as stop:
        main(["verify", "net.onnx", "p.vnnlib", "--timeout", value])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --timeout: a positive, finite number of seconds, not {value}" in err or (
        value == "abc" and "argument --timeout: a number of seconds, not 'abc'" in err
    ), err
