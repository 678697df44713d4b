"""The ``precision`` option: reduced precision in an attack's search, successes in fp32.

Whether ``bf16`` is offered depends on the CPU (AVX512-BF16 or AMX; the machines this runs on
change between sessions), so tests that run bf16 patch ``fast_precisions`` to what such a CPU
reports, and tests of the refusal patch it to a CPU without them (autocast to bf16 works on
any CPU, only slowly).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import aisafety.attack.precision as precision
from aisafety.attack.base import Attack
from aisafety.attack.pgd import PGDLinf
from aisafety.attack.precision import ReducedPrecision, compute_dtype, fast_precisions
from aisafety.cli import main
from aisafety.config import plan_from_dict
from aisafety.database.zoo import load_zoo_model
from aisafety.errors import ConfigError
from aisafety.interfaces import AttackFamily, Capability, Norm
from aisafety.plugins import default_registry
from aisafety.prediction.base import Predictor
from aisafety.prediction.footprint import image_bytes
from aisafety.prediction.torch_module import TorchPredictor
from aisafety.runner import with_plan_precision

CPU = torch.device("cpu")


@pytest.fixture
def fast_bf16(monkeypatch):
    """Pretend this CPU has AVX512-BF16 (the search then really runs under bf16 autocast)."""
    monkeypatch.setattr(precision, "fast_precisions", lambda device: ("bf16",))


@pytest.fixture
def no_fast_bf16(monkeypatch):
    monkeypatch.setattr(precision, "fast_precisions", lambda device: ())


def disagreeing_model() -> TorchPredictor:
    """Two pixels, two classes: logit 0 = 256 (x0 - x1), logit 1 = 0.03. At x = (0.5 + 2^-12,
    0.5) fp32 gives logit 0 = 0.0625 (class 0), while bf16 rounds x0 to 0.5 (spacing 2^-9
    there), so logit 0 = 0 and the bf16 model says class 1."""
    linear = nn.Linear(2, 2)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor([[256.0, -256.0], [0.0, 0.0]]))
        linear.bias.copy_(torch.tensor([0.0, 0.03]))
    return TorchPredictor(nn.Sequential(nn.Flatten(), linear), (1, 1, 2), 2, name="disagree")


DISAGREEING_X = torch.tensor([[[[0.5 + 2**-12, 0.5]]]])


class ReturnsItsInput(Attack):
    """Returns the input as its 'adversarial' example, noting what its predictor said."""

    name = "returns-input"
    family = AttackFamily.GRADIENT
    norm = Norm.LINF
    requires = Capability.SCORES
    seen: list[tuple[Predictor, torch.Tensor]]  # set per instance

    def perturb(self, predictor, x, y, eps, call):
        with torch.no_grad():
            self.seen.append((predictor, predictor._logits(x).argmax(1) != y))
        return x.clone(), torch.ones(len(x), dtype=torch.long)


def returns_input(**config) -> ReturnsItsInput:
    attack = ReturnsItsInput(config)
    attack.seen = []
    return attack


# --- the fp32 re-check ---------------------------------------------------------------------


def test_the_toy_model_disagrees_between_bf16_and_fp32():
    model, y = disagreeing_model(), torch.tensor([0])
    assert model.logits(DISAGREEING_X).argmax(1).tolist() == [0]
    assert ReducedPrecision(model, torch.bfloat16).logits(DISAGREEING_X).argmax(1).tolist() == [1]
    assert y.tolist() == [0]


def test_a_success_only_in_bf16_is_not_counted(fast_bf16):
    model, y = disagreeing_model(), torch.tensor([0])
    attack = returns_input(precision="bf16")
    result = attack(model, DISAGREEING_X, y, 0.01)
    searched_with, bf16_says_fooled = attack.seen[0]
    assert isinstance(searched_with, ReducedPrecision) and bf16_says_fooled.tolist() == [True]
    # the stored outcome is the fp32 model's verdict on the stored example
    assert result.success.tolist() == [False] and result.robust_accuracy == 1.0
    assert torch.equal(result.adv_logits, model.logits(result.x_adv))
    assert torch.equal(result.x_adv, DISAGREEING_X)


def test_pgd_stopping_on_a_bf16_success_does_not_count_it(fast_bf16):
    """Early stop sees the bf16 misclassification at the start point and stops there."""
    model, y = disagreeing_model(), torch.tensor([0])
    fp32 = PGDLinf(steps=3, random_start=False, early_stop=True)(model, DISAGREEING_X, y, 0.0)
    bf16 = PGDLinf(steps=3, random_start=False, early_stop=True, precision="bf16")(
        model, DISAGREEING_X, y, 0.0
    )
    assert fp32.steps.tolist() == [3] and bf16.steps.tolist() == [0]
    assert fp32.success.tolist() == [False] and bf16.success.tolist() == [False]


def test_the_search_runs_in_bf16_and_the_check_in_fp32(fast_bf16, zoo_predictor, mnist_subset):
    calls: list[tuple[bool, bool]] = []  # (under autocast, input in channels-last)
    image_bytes(zoo_predictor, grad=True)  # the memory estimate's own pass, cached, first
    second_conv = zoo_predictor.network[1][3]  # 16 input channels: the layouts differ
    hook = second_conv.register_forward_pre_hook(
        lambda module, inputs: calls.append(
            (
                torch.is_autocast_enabled("cpu"),
                not inputs[0].is_contiguous()
                and inputs[0].is_contiguous(memory_format=torch.channels_last),
            )
        )
    )
    data = mnist_subset(8)
    try:
        PGDLinf(steps=2, precision="bf16")(zoo_predictor, data.x, data.y, 0.1)
    finally:
        hook.remove()
    # the clean logits and the final check in fp32 and NCHW; the channels-last copy (its
    # hooks copied with it) checked once in fp32, then the two steps under autocast
    assert calls == [(False, False), (False, True), (True, True), (True, True), (False, False)]
    assert second_conv.weight.is_contiguous()  # the user's network keeps its layout


def test_reduced_precision_logits_are_fp32_tensors_of_bf16_values(zoo_predictor, mnist_subset):
    x = mnist_subset(4).x.requires_grad_(True)
    view = ReducedPrecision(zoo_predictor, torch.bfloat16)
    logits = view._logits(x)
    assert logits.dtype == torch.float32
    assert torch.equal(logits, logits.to(torch.bfloat16).float())  # bf16 values
    assert not torch.equal(logits, zoo_predictor._logits(x))
    (grad,) = torch.autograd.grad(logits.sum(), x)
    assert grad.dtype == torch.float32 and torch.isfinite(grad).all()
    assert view.name == zoo_predictor.name and view.network is zoo_predictor.network


GRADIENT_ATTACKS = [
    n
    for n in default_registry().names("attack")
    if default_registry().get("attack", n).family is AttackFamily.GRADIENT
]


@pytest.mark.parametrize("name", GRADIENT_ATTACKS)
def test_every_gradient_attack_searches_in_bf16_and_reports_fp32(name, fast_bf16, mnist_subset):
    """A small model keeps bf16 cheap on this CPU; every result's success is the fp32 one."""
    network = nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.ReLU(), nn.Linear(32, 10))
    torch.manual_seed(0)
    model = TorchPredictor(network, (1, 28, 28), 10, name="tiny")
    autocast_seen: list[bool] = []
    network.register_forward_pre_hook(
        lambda module, inputs: autocast_seen.append(torch.is_autocast_enabled("cpu"))
    )
    registry = default_registry()
    cls = registry.get("attack", name)
    fields = cls.Config.model_fields
    fast = {k: v for k, v in {"steps": 3, "binary_search_steps": 1}.items() if k in fields}
    attack = registry.create("attack", name, {**fast, "precision": "bf16"})
    x = mnist_subset(8).x
    with torch.no_grad():  # labels the untrained model gets right: attacks that skip
        y = model.logits(x).argmax(1)  # misclassified samples (APGD-T, FAB-T, ensembles) run
    eps = {Norm.LINF: 0.1, Norm.L2: 1.0, Norm.L1: 8.0}[attack.norm]
    result = attack(model, x, y, eps)
    assert any(autocast_seen), f"{name} never ran the model under autocast"
    with torch.no_grad():
        fp32_pred = model.logits(result.x_adv).argmax(1)
    assert torch.equal(result.success, fp32_pred != y)


# --- the option ----------------------------------------------------------------------------


def test_fast_precisions_follow_the_cpu_flags(monkeypatch):
    monkeypatch.setattr(precision, "_cpu_flags", lambda: {"avx2": True})
    assert fast_precisions(CPU) == ()
    monkeypatch.setattr(precision, "_cpu_flags", lambda: {"avx512_bf16": True})
    assert fast_precisions(CPU) == ("bf16",)
    monkeypatch.setattr(precision, "_cpu_flags", lambda: {"amx_bf16": True})
    assert fast_precisions(CPU) == ("bf16",)
    assert fast_precisions(torch.device("meta")) == ()


def test_auto_on_this_cpu_follows_the_flags_the_kernel_reports():
    """Unpatched: ``auto`` on the machine running the tests is bf16 exactly where the kernel
    reports AVX512-BF16 or AMX-BF16, else fp32, and ``bf16`` is refused there (the project's
    VM has been both: an AVX2-only AMD EPYC, fp32, and an AVX512-BF16 one, bf16)."""
    flags = precision.kernel_cpu_flags()
    if not flags:
        pytest.skip("no /proc/cpuinfo flags on this system")
    has_bf16 = bool({"avx512_bf16", "amx_bf16"} & flags)
    assert fast_precisions(CPU) == (("bf16",) if has_bf16 else ())
    assert compute_dtype("auto", CPU, "x") is (torch.bfloat16 if has_bf16 else None)
    if not has_bf16:
        with pytest.raises(ConfigError, match="AVX512-BF16"):
            compute_dtype("bf16", CPU, "attack 'pgd-linf'")


def test_kernel_cpu_flags_reads_the_flags_line(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx avx2 fma\n")
    assert precision.kernel_cpu_flags(cpuinfo) == {"fpu", "avx", "avx2", "fma"}
    assert precision.kernel_cpu_flags(tmp_path / "absent") == frozenset()


def test_auto_is_bf16_where_fast_and_fp32_elsewhere(monkeypatch):
    monkeypatch.setattr(precision, "fast_precisions", lambda device: ("bf16",))
    assert compute_dtype("auto", CPU, "x") is torch.bfloat16
    monkeypatch.setattr(precision, "fast_precisions", lambda device: ())
    assert compute_dtype("auto", CPU, "x") is None
    assert compute_dtype("fp32", CPU, "x") is None


def test_auto_without_fast_bf16_is_exactly_fp32(no_fast_bf16, zoo_predictor, mnist_subset):
    data = mnist_subset(16)
    fp32 = PGDLinf(steps=3)(zoo_predictor, data.x, data.y, 0.1)
    auto = returns_input(precision="auto")
    auto(zoo_predictor, data.x, data.y, 0.1)
    assert auto.seen[0][0] is zoo_predictor  # no autocast view at all
    again = PGDLinf(steps=3, precision="auto")(zoo_predictor, data.x, data.y, 0.1)
    assert torch.equal(fp32.x_adv, again.x_adv) and torch.equal(fp32.success, again.success)


@pytest.mark.parametrize("asked", ["bf16", "fp16"])
def test_a_precision_the_cpu_lacks_is_an_error_naming_option_value_and_fix(
    asked, no_fast_bf16, zoo_predictor, mnist_subset
):
    data = mnist_subset(2)
    with pytest.raises(ConfigError) as error:
        PGDLinf(precision=asked)(zoo_predictor, data.x, data.y, 0.1)
    message = str(error.value)
    assert "attack 'pgd-linf'" in message and f"precision {asked!r}" in message
    assert "precision: auto" in message and "precision: fp32" in message
    assert "this CPU" in message


def test_the_real_cpu_check_matches_its_flags(zoo_predictor, mnist_subset):
    """Without patches: bf16 runs where the CPU reports AVX512-BF16/AMX and fails elsewhere."""
    data = mnist_subset(2)
    attack = PGDLinf(steps=1, precision="bf16")
    if "bf16" in fast_precisions(CPU):
        assert attack(zoo_predictor, data.x, data.y, 0.1).success.shape == (2,)
    else:
        with pytest.raises(ConfigError, match="precision 'bf16'"):
            attack(zoo_predictor, data.x, data.y, 0.1)


def test_a_precision_that_does_not_exist_names_the_option():
    with pytest.raises(ConfigError, match="precision"):
        PGDLinf(precision="bf8")
    with pytest.raises(ConfigError, match="precision"):
        plan_from_dict({"precision": "half", "attacks": ["fgsm"]})


def test_the_plan_precision_goes_to_every_attack_without_its_own():
    raw = {
        "precision": "auto",
        "attacks": [
            {"name": "pgd-linf", "eps": 0.1},
            {"name": "fgsm", "config": {"precision": "fp32"}},
        ],
    }
    plan = with_plan_precision(plan_from_dict(raw), default_registry())
    assert plan.attacks[0].config == {"precision": "auto"}
    assert plan.attacks[0].label == "pgd-linf(precision=auto)"
    assert plan.attacks[1].config == {"precision": "fp32"}
    default = plan_from_dict({"attacks": ["fgsm"]})
    assert with_plan_precision(default, default_registry()) is default


def test_evaluate_with_bf16_where_the_cpu_lacks_it_fails_before_any_work(
    tmp_path, capsys, no_fast_bf16
):
    plan = tmp_path / "plan.yaml"
    plan.write_text("precision: bf16\nattacks: [{name: fgsm, eps: 0.1}]\nmetrics: [ca, aaw]\n")
    db = tmp_path / "r.db"
    assert main(["evaluate", str(plan), "--db", f"sqlite:///{db}", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "precision 'bf16'" in err and "precision: auto" in err and "Traceback" not in err


# --- strength ------------------------------------------------------------------------------


def _robust_accuracy_gap(n: int, mnist_subset) -> tuple[float, float]:
    model, data = load_zoo_model("mnist-cnn-pgd-at"), mnist_subset(n)
    fp32 = PGDLinf(steps=40)(model, data.x, data.y, 0.3).robust_accuracy
    bf16 = PGDLinf(steps=40, precision="bf16")(model, data.x, data.y, 0.3).robust_accuracy
    return fp32, bf16


def test_bf16_pgd_robust_accuracy_is_within_half_a_point_of_fp32(fast_bf16, mnist_subset):
    fp32, bf16 = _robust_accuracy_gap(200, mnist_subset)
    assert abs(bf16 - fp32) <= 0.005 + 1e-9, (fp32, bf16)


@pytest.mark.slow
def test_bf16_pgd_robust_accuracy_on_1000_images(fast_bf16, mnist_subset):
    fp32, bf16 = _robust_accuracy_gap(1000, mnist_subset)
    assert abs(bf16 - fp32) <= 0.005 + 1e-9, (fp32, bf16)


# --- models autocast cannot reach ----------------------------------------------------------


def onnxruntime_model() -> Predictor:
    """A two-by-two image to three scores, run by ONNX Runtime (no PyTorch code)."""
    from onnx import TensorProto, helper, numpy_helper

    from aisafety.prediction.onnx_model import OnnxRuntimePredictor

    weight = numpy_helper.from_array(torch.eye(3, 4).numpy(), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    nodes = [
        helper.make_node("Flatten", ["x"], ["f"]),
        helper.make_node("Gemm", ["f", "w"], ["y"], transB=1),
    ]
    graph = helper.make_graph(nodes, "g", [x], [y], initializer=[weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return OnnxRuntimePredictor(model.SerializeToString(), name="tiny.onnx")


def remote_model() -> Predictor:
    """A served model; nothing listens at the address, and nothing may be asked of it."""
    from aisafety.prediction.remote import RemotePredictor

    return RemotePredictor("http://127.0.0.1:9", "m", (1, 2, 2), 3, input_name="x", retries=0)


class OwnScores(Predictor):
    """A user's own predictor with no PyTorch ``network`` (its code is its own business)."""

    name, num_classes, input_shape = "own", 3, (1, 2, 2)
    capabilities = frozenset({Capability.SCORES, Capability.LABELS})

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        raise AssertionError("a refused search must not ask the model")


def defended_onnxruntime_model() -> Predictor:
    from aisafety.defense.bit_depth import BitDepthReduction

    return BitDepthReduction(onnxruntime_model(), bits=8)


UNREACHED = {
    "onnxruntime": (onnxruntime_model, "an ONNX Runtime model"),
    "remote": (remote_model, "a remote model"),
    "own predictor": (OwnScores, "a predictor of class OwnScores, with no PyTorch network"),
    "onnxruntime behind a defense": (defended_onnxruntime_model, "an ONNX Runtime model"),
}


@pytest.mark.parametrize("kind", UNREACHED)
def test_bf16_on_a_model_autocast_cannot_reach_is_refused_and_auto_is_fp32(kind, monkeypatch):
    """autocast reaches PyTorch code only, so ``precision: bf16`` on these ran in fp32 under
    a stored bf16 label: now a ConfigError before any query, naming the model's kind, the
    precision and the fix; ``auto`` searches the model itself (fp32), with no view."""
    monkeypatch.setattr(precision, "fast_precisions", lambda device: ("bf16", "fp16"))
    build, words = UNREACHED[kind]
    model = build()
    x, y = torch.rand(2, 1, 2, 2), torch.tensor([0, 1])
    for asked in ("bf16", "fp16"):
        with pytest.raises(ConfigError) as refused:
            returns_input(precision=asked)(model, x, y, 0.1)
        message = str(refused.value)
        assert f"attack 'returns-input': precision {asked!r}" in message, message
        assert words in message and repr(model.name) in message, message
        assert f"run in fp32, not {asked}" in message and "precision: fp32 or auto" in message
    assert getattr(model, "requests_sent", 0) == 0
    assert returns_input(precision="auto").search_predictor(model) is model


def test_torchscript_and_exported_programs_do_run_in_bf16(fast_bf16):
    """They are PyTorch code, so autocast reaches them (not refused): their bf16 search
    view rounds the disagreeing point to the other class, as the eager module's does."""
    from aisafety.prediction.exported import ExportedPredictor
    from aisafety.prediction.torchscript import TorchScriptPredictor

    module = disagreeing_model().module
    batch = {0: torch.export.Dim("batch")}
    two = DISAGREEING_X.expand(2, -1, -1, -1)  # a batch of one would fix the batch size
    program = torch.export.export(module, (two,), dynamic_shapes=(batch,))
    for model in (
        TorchScriptPredictor(torch.jit.trace(module, DISAGREEING_X), (1, 1, 2), 2),
        ExportedPredictor(program, (1, 1, 2), 2),
    ):
        searcher = returns_input(precision="bf16").search_predictor(model)
        assert isinstance(searcher, ReducedPrecision)
        assert model.logits(DISAGREEING_X).argmax(1).tolist() == [0]
        assert searcher.logits(DISAGREEING_X).argmax(1).tolist() == [1]
