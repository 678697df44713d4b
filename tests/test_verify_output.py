"""What `aisafety verify` prints and writes (aisafety/cli/verify.py): the answer first, as
VNN-COMP tools print it; a comment line naming the wall and CPU seconds beside the limit and
the clock that counted it (`--clock`: wall by default, as VNN-COMP); `--out` VNN-COMP's
results file (the status, then for sat the counterexample), the terminal then without the
counterexample; and a warning where `--mean/--std` are declared for a network that
normalises its own input (the box check would otherwise advise normalising the box twice)."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

from aisafety.cli import main
from aisafety.errors import AISafetyWarning
from aisafety.verification import vnncomp

onnx = pytest.importorskip("onnx", reason="onnx is not installed: pip install 'aisafety[onnx]'")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

W = np.array([[1.0, -1.0, 0.5, 0.0], [0.5, 1.0, -1.0, 1.0], [-1.0, 0.0, 1.0, 0.5]], np.float32)


def net(path, top: int, first: tuple = ()) -> str:
    """A 4-input, 3-output Gemm net, class ``top`` ahead by 10 near [0, 1] inputs;
    ``first``: (op, constant) nodes before the Gemm (an in-graph normalisation)."""
    bias = np.zeros(3, np.float32)
    bias[top] = 10.0
    inits = [numpy_helper.from_array(W, "W"), numpy_helper.from_array(bias, "b")]
    nodes, x = [], "x"
    for k, (op, value) in enumerate(first):
        inits.append(numpy_helper.from_array(np.array([value], np.float32), f"c{k}"))
        nodes.append(helper.make_node(op, [x, f"c{k}"], [f"h{k}"]))
        x = f"h{k}"
    nodes.append(helper.make_node("Gemm", [x, "W", "b"], ["y"], transB=1))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], inits,
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return str(path)


CENTRE, EPS = [0.2, 0.4, 0.6, 0.8], 0.05


def spec(path) -> str:
    """The box CENTRE +- EPS and the atom Y_1 >= Y_0 (sat where class 1 leads)."""
    lines = [f"(declare-const X_{i} Real)" for i in range(4)]
    lines += [f"(declare-const Y_{j} Real)" for j in range(3)]
    lines += [f"(assert (>= X_{i} {c - EPS}))\n(assert (<= X_{i} {c + EPS}))"
              for i, c in enumerate(CENTRE)]  # fmt: skip
    path.write_text("\n".join([*lines, "(assert (>= Y_1 Y_0))\n"]))
    return str(path)


@pytest.mark.parametrize("clock, named", [([], "wall"), (["--clock", "cpu"], "CPU")])
def test_the_limits_clock_is_named_and_reaches_the_verifier(
    tmp_path, monkeypatch, capsys, clock, named
):
    given = {}
    real = vnncomp.verify_instance

    def spy(*args, **kwargs):
        given.update(kwargs["config"])
        return real(*args, **kwargs)

    monkeypatch.setattr(vnncomp, "verify_instance", spy)
    argv = ["verify", net(tmp_path / "n.onnx", top=0), spec(tmp_path / "p.vnnlib")]
    assert main([*argv, "--verifier", "crown", "--timeout", "7", *clock]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "unsat"
    assert given == {"clock": "cpu" if clock else "wall"}
    pattern = rf"# crown: \d+\.\d\d s wall, \d+\.\d\d s CPU \(limit 7 s of {named} time, "
    assert re.match(pattern + rf"--clock {given['clock']}\), margin bound \d", out[1]), out[1]


@pytest.mark.filterwarnings("ignore:VNN-LIB file 'p.vnnlib'")  # class 1 leads: sat at once
def test_out_writes_vnncomps_results_file_and_the_terminal_keeps_the_status(tmp_path, capsys):
    import onnxruntime

    path, results = net(tmp_path / "n.onnx", top=1), tmp_path / "out" / "result.txt"
    argv = ["verify", path, spec(tmp_path / "p.vnnlib"), "--verifier", "crown"]
    assert main([*argv, "--out", str(results)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "sat" and not any("X_0" in line for line in out)
    assert out[-1] == f"# written to {results} (with the counterexample)"
    text = results.read_text()
    assert text.startswith("sat\n((X_0 ") and text.endswith("))\n")
    values = dict(re.findall(r"\((\w+) (\S+?)\)", text))
    x = np.array([[float(values[f"X_{i}"]) for i in range(4)]], np.float32)
    assert all(c - EPS <= v <= c + EPS for c, v in zip(CENTRE, x[0], strict=True))
    y = onnxruntime.InferenceSession(path).run(None, {"x": x})[0][0]  # the point, replayed
    assert y[1] >= y[0]
    np.testing.assert_allclose(y, [float(values[f"Y_{j}"]) for j in range(3)], rtol=1e-6)


def test_out_of_an_unsat_instance_is_the_status_alone(tmp_path, capsys):
    results = tmp_path / "result.txt"
    argv = ["verify", net(tmp_path / "n.onnx", top=0), spec(tmp_path / "p.vnnlib")]
    assert main([*argv, "--verifier", "crown", "--out", str(results)]) == 0
    assert results.read_text() == "unsat\n"
    assert capsys.readouterr().out.splitlines()[-1] == f"# written to {results}"


@pytest.mark.parametrize("own", [True, False])
def test_mean_and_std_on_a_network_that_normalises_itself_are_warned(tmp_path, own):
    first = (("Sub", 0.1307), ("Div", 0.3081)) if own else ()
    argv = ["verify", net(tmp_path / "n.onnx", top=0, first=first), spec(tmp_path / "p.vnnlib")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main([*argv, "--verifier", "crown", "--mean", "0.1307", "--std", "0.3081"]) == 0
    said = "network 'n.onnx': its own normalisation (Sub 0.1307, then Div) takes [0, 1] pixels"
    named = [str(w.message) for w in caught if str(w.message).startswith(said)]
    assert len(named) == own and all("Drop --mean and --std" in m for m in named)
    assert all(issubclass(w.category, AISafetyWarning) for w in caught)


def test_memory_gib_reaches_the_verifier_and_its_refusal_is_one_error_line(tmp_path, capsys):
    argv = ["verify", net(tmp_path / "n.onnx", top=0), spec(tmp_path / "p.vnnlib")]
    assert main([*argv, "--verifier", "crown", "--memory-gib", "1e-9"]) == 2
    out = capsys.readouterr()
    assert out.err.startswith("error: verifier 'crown' on model 'n.onnx'") and not out.out
    assert "over the memory budget of 9.54e-07 MiB" in out.err  # 1e-9 GiB
    assert out.err.count("\n") == 1 and "Traceback" not in out.err


def test_an_out_file_it_cannot_write_loses_no_answer(tmp_path, capsys):
    argv = ["verify", net(tmp_path / "n.onnx", top=0), spec(tmp_path / "p.vnnlib")]
    assert main([*argv, "--verifier", "crown", "--out", str(tmp_path)]) == 2  # a folder
    out = capsys.readouterr()
    assert out.out.splitlines()[0] == "unsat" and out.out.splitlines()[1].startswith("# crown")
    assert out.err.startswith(f"error: cannot write --out {str(tmp_path)!r}")


def test_an_interrupted_instance_says_nothing_of_a_database(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C, or SIGTERM (main turns it into one)

    monkeypatch.setattr(vnncomp, "verify_instance", interrupted)
    assert main(["verify", "net.onnx", "p.vnnlib"]) == 130
    out = capsys.readouterr()
    assert out.err == "interrupted: no answer (verify keeps nothing); run it again\n"
    assert not out.out


def test_gzip_compressed_files_are_read_as_vnncomp_ships_them(tmp_path, capsys):
    import gzip

    plain = [net(tmp_path / "n.onnx", top=0), spec(tmp_path / "p.vnnlib")]
    packed = []
    for path in plain:
        packed.append(f"{path}.gz")
        with open(path, "rb") as file, gzip.open(packed[-1], "wb") as out:
            out.write(file.read())
    answers = []
    for files in (plain, packed):
        assert main(["verify", *files, "--verifier", "crown"]) == 0
        out = capsys.readouterr().out.splitlines()
        answers.append((out[0], out[1].split("margin bound")[1]))
    assert answers[0] == answers[1] and answers[0][0] == "unsat"
