"""`aisafety verify`'s user mistakes (issues 32/33): each is one `error:` line, exit 2, no
traceback."""

from __future__ import annotations

import numpy as np
import pytest

from aisafety.cli import main

onnx = pytest.importorskip("onnx", reason="onnx is not installed: pip install 'aisafety[onnx]'")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _onnx(path, first: list | None = None, inputs: int = 1, dtype=TensorProto.FLOAT) -> str:
    """A 4-input, 3-output Gemm net; ``first``: (op, constant) nodes run on its input
    before the Gemm (an in-graph normalisation); ``inputs``: how many graph inputs."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((3, 4)).astype(np.float32), "W"),
             numpy_helper.from_array(np.zeros(3, np.float32), "b")]  # fmt: skip
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


def _error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    out = capsys.readouterr()
    assert out.err.startswith("error: ") and out.err.count("\n") == 1, out.err
    assert "Traceback" not in out.err and not out.out
    return out.err


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
     (["net.onnx", "p.vnnlib", "--verifier", "pgd-linf"], "unknown verifier 'pgd-linf'; known ")],

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
