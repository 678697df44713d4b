"""`aisafety verify` on the CIFAR-10 VNN-COMP instances (shared/data/cifar10-models): boxes
in the networks' own input spaces (normalised for the ResNets, channels-last [0, 1] for the
Marabou nets), conjunctions of output atoms (Marabou's targeted properties), answers that
are never an error, and every ``sat`` replayed through onnxruntime on the original file.
The sweep over all 144 instances is ``bench/verify_cifar10.py`` (docs/certification.md)."""

from __future__ import annotations

import pytest
import torch
from vnncomp_cifar10 import instances, replays

from aisafety.cli import main
from aisafety.plugins import default_registry
from aisafety.verification.graph import VerificationError
from aisafety.verification.vnncomp import verify_instance
from aisafety.verification.vnnlib import read_disjuncts, read_vnnlib
from tests.shared_data import absent, located

pytest.importorskip("onnxruntime")
SHARED = located("cifar10-models")

HEADER = "".join(f"(declare-const X_{i} Real)\n" for i in range(2)) + "".join(
    f"(declare-const Y_{j} Real)\n" for j in range(3)
)
BOX = "(assert (>= X_0 -2.0))\n(assert (<= X_0 2.5))\n(assert (and (>= X_1 0) (<= X_1 255)))\n"


def test_asserted_atoms_are_one_conjunction_and_or_of_ands_a_disjunction(tmp_path):
    """SMT-LIB conjoins asserts: 'Y_1 >= Y_0' and 'Y_1 >= Y_2' asserted apart is ONE
    disjunct of two rows (the target wins), not two ways to violate the property."""
    conj = tmp_path / "conj.vnnlib"
    conj.write_text(HEADER + BOX + "(assert (>= Y_1 Y_0))\n(assert (>= Y_1 Y_2))\n")
    (lower, upper), disjuncts = read_disjuncts(conj, 2, 3)
    assert lower.tolist() == [-2.0, 0.0] and upper.tolist() == [2.5, 255.0]
    assert len(disjuncts) == 1 and len(disjuncts[0]) == 2
    # the row -(Y_1 - Y_0) is <= 0 exactly where the atom Y_1 >= Y_0 holds
    assert disjuncts[0][0][0].tolist() == [1.0, -1.0, 0.0]
    with pytest.raises(VerificationError, match="conjunction"):
        read_vnnlib(conj, 2, 3)  # the all-rows-positive form cannot say it
    dnf = tmp_path / "dnf.vnnlib"
    dnf.write_text(
        HEADER + BOX + "(assert (or (and (>= Y_0 Y_2)) (and (>= Y_1 Y_2) (<= Y_0 1))))\n"
    )
    _, disjuncts = read_disjuncts(dnf, 2, 3)
    assert [len(rows) for rows in disjuncts] == [1, 2]
    mixed = tmp_path / "mixed.vnnlib"
    mixed.write_text(
        HEADER + BOX + "(assert (or (>= Y_0 Y_2) (>= Y_1 Y_2)))\n(assert (>= Y_1 1))\n"
    )
    with pytest.raises(VerificationError, match="beside"):
        read_disjuncts(mixed, 2, 3)


INSTANCES = instances(SHARED) if SHARED else []
pytestmark = pytest.mark.skipif(not INSTANCES, reason=absent("cifar10-models"))
FIRST = {}
for _net, _spec_path, _ in INSTANCES:
    FIRST.setdefault(_net.stem, (_net, _spec_path))


@pytest.mark.parametrize("name", sorted(FIRST))
def test_verify_answers_on_each_network_in_its_own_input_space(name, capsys):
    network, spec = FIRST[name]
    code = main(["verify", str(network), str(spec), "--verifier", "crown", "--timeout", "20"])
    out = capsys.readouterr().out
    status = out.splitlines()[0]
    print(name, spec.name, status)
    assert code == 0 and status in ("sat", "unsat", "timeout", "unknown")
    if status == "sat":
        counterexample = out.split("\n", 1)[1].rsplit("\n#", 1)[0]
        assert replays(network, spec, counterexample)


def test_a_targeted_marabou_property_is_falsified_only_where_the_target_wins():
    """cifar10_small at eps 0.024: the counterexample makes the target the top class
    under onnxruntime (all nine atoms), not merely beat one other class."""
    hits = [(n, s) for n, s, _ in INSTANCES if n.stem == "cifar10_small" and "0.024" in s.name]
    if not hits:
        pytest.skip("no cifar10_small instance at 0.024")
    results = []
    for network, spec in hits[:4]:
        result = verify_instance(default_registry(), network, spec, "crown", 20)
        results.append(result.status)
        if result.status == "sat":
            assert replays(network, spec, result.counterexample)
            target = int(spec.stem.split("target")[1].split("_")[0])
            lines = result.counterexample.splitlines()
            y = [float(ln.split()[1].rstrip(")")) for ln in lines if "Y_" in ln]
            assert max(range(len(y)), key=y.__getitem__) == target
    print("cifar10_small at 0.024:", results)
    assert set(results) <= {"sat", "unsat", "timeout", "unknown"}


def test_the_bound_graph_agrees_with_onnxruntime_off_the_unit_box():
    """The ResNets take normalised inputs around [-2, 2.2]: the graph built for verify and
    onnxruntime agree there, where the platform's predictors would refuse the input."""
    from aisafety.verification.vnncomp import load_network

    network = next(n for n, _, _ in INSTANCES if n.stem == "resnet_2b")
    net = load_network(str(network))
    x = torch.rand(4, *net.shape, generator=torch.Generator().manual_seed(0)) * 4.3 - 2.1
    graph_out = net.graph.forward(x.double()).float()
    assert torch.allclose(graph_out, net.run(x), atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(SHARED is None, reason=absent("cifar10-models"))
def test_the_conjunction_attack_breaks_the_marabou_instance_alpha_beta_crown_broke():
    """cifar10_medium index2317 (eps 0.012) is violated (alpha-beta-CROWN's PGD, session 15:
    class 6 leads by 3.5e-4); box-PGD on the largest row alone, at any restarts, stopped at
    +0.20. ``all_rows_hold`` must find a point where every atom holds, replayed."""
    from aisafety.verification.vnncomp import all_rows_hold, load_network, rows_property

    name = "networkcifar10_medium_index2317_eps0.012_target6_orig5.vnnlib"
    network, spec = next((n, s) for n, s, _ in INSTANCES if s.name == name)
    net = load_network(str(network))
    box, disjuncts = read_disjuncts(spec, 3072, 10)
    lower, upper = (b.reshape(1, *net.shape) for b in box)
    point = all_rows_hold(net, rows_property(lower, upper, disjuncts[0]))
    assert point is not None
    text = "\n".join(f"(X_{i} {v!r})" for i, v in enumerate(point.flatten().tolist()))
    assert replays(network, spec, text)
