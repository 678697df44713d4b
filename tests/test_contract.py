"""One contract for every registered plugin, as Foolbox 3's attack tests run every attack.

Each registered attack, input defense, training defense, metric and architecture goes through
the same checks on a tiny problem (8 MNIST images, the zoo CNN), and each registered verifier
through the soundness contracts on tiny nets (its section below), parametrized with its
registry name as the test id. A new plugin is checked without a
line added here; settings that only shorten a run (``FAST``) apply where a class has them.
"""

from __future__ import annotations

import copy
import functools
import math

import pytest
import torch

from aisafety.database.architectures import build
from aisafety.database.scaled_mlp import scaled_mlp, smooth_net
from aisafety.defense.training.base import TrainingStep
from aisafety.errors import InputError
from aisafety.evaluation.base import AttackMetric, CleanMetric, Metric
from aisafety.evaluation.context import EvaluationContext
from aisafety.hookspecs import hookimpl
from aisafety.interfaces import AttackFamily, AttackSpec, Capability, Direction, MetricValue, Norm
from aisafety.plugins import KINDS, build_registry, default_registry
from aisafety.prediction.torch_module import Normalize, TorchPredictor
from aisafety.verification.falsify import pgd_on_rows, replay
from aisafety.verification.graph import VerificationError, build_graph
from aisafety.verification.incomplete import CrownVerifier, IBPVerifier
from aisafety.verification.property import robustness_property
from aisafety.verification.registry import make_verifier
from aisafety.verification.result import Verdict

REGISTRY = default_registry()
N = 8
BUDGET = {Norm.LINF: 0.1, Norm.L2: 1.0, Norm.L1: 8.0}
# Shorter runs only: fewer steps, queries, frames, directions. Applied where a Config has the field.
FAST = {
    "steps": 3,
    "queries": 20,
    "iterations": 3,
    "population": 8,
    "binary_search_steps": 1,
    "init_draws": 20,
    "init_search_steps": 3,
    "samples": 16,
    "nb_samples_per_step": 8,
    "max_steps": 20,
    "n_frames": 3,
    "n_directions": 3,
    "levels": 4,
    "refine": 2,
    "n_perturbations": 2,
    "frontier_steps": 2,
    "attack_config": {"steps": 2},
    # the cheapest verifier for the metrics that take one (the zoo CNN's max-pooling is
    # bounded by every CROWN-family, LP and MILP verifier too, docs/certification.md)
    "verifier": "ibp",
}
# Metrics only (the verifier contract keeps the verifiers' own box-PGD): randomized
# smoothing's estimation draws (10,000 by default: 15 CPU s for 8 images; 500 still certify
# radii up to 0.5) and the radius metric's box-PGD steps (50 at every step of its bisection).
METRIC_FAST = {**FAST, "n": 500, "attack_steps": 3}


def names(kind: str) -> list[str]:
    return REGISTRY.names(kind) if kind in KINDS else []


def fast_config(cls: type, settings: dict = FAST, **extra) -> dict:
    fields = getattr(getattr(cls, "Config", None), "model_fields", {})
    return {**{k: v for k, v in settings.items() if k in fields}, **extra}


@pytest.fixture(scope="module")
def batch(mnist_subset):
    data = mnist_subset(N)
    return data.x, data.y


# --- attacks ------------------------------------------------------------------------------


def _attack(name: str, **extra):
    cls = REGISTRY.get("attack", name)
    return REGISTRY.create("attack", name, fast_config(cls, **extra))


@pytest.mark.parametrize("name", names("attack"))
def test_attack_contract(name, zoo_predictor, batch):
    x, y = batch
    attack = _attack(name, seed=1)
    described = type(attack).describe()
    assert described["name"] == name and described["description"], "describe() incomplete"
    assert {"family", "norm", "requires"} <= described.keys()
    assert isinstance(attack.requires, Capability) and isinstance(attack.family, AttackFamily)
    eps = BUDGET[attack.norm]
    result = attack(zoo_predictor, x, y, eps)
    x_adv = result.x_adv.cpu()
    assert x_adv.shape == x.shape and x_adv.dtype == x.dtype
    assert torch.isfinite(x_adv).all() and x_adv.min() >= 0 and x_adv.max() <= 1, "box"
    delta = (x_adv - x).flatten(1).double()
    size = {  # every attack declares an l-inf, l2 or l1 budget (the base refuses others)
        Norm.LINF: delta.abs().amax(1),
        Norm.L2: delta.norm(dim=1),
        Norm.L1: delta.abs().sum(1),
    }[attack.norm]
    assert (size <= eps * (1 + 1e-5) + 1e-6).all(), f"over budget: {size.max():.6g} > {eps}"
    assert torch.equal(result.y.cpu(), y)
    assert torch.equal(result.success.cpu(), result.adv_logits.argmax(1).cpu() != y)
    assert result.steps.shape == (N,) and (result.steps >= 0).all()
    _check_knobs(attack, zoo_predictor, x, y, eps, result)


def _check_knobs(attack, predictor, x, y, eps, result) -> None:
    """The class attributes that change stored results (``Attack``'s docstring) hold."""
    assert isinstance(attack.cpu_chunk, int) and attack.cpu_chunk > 0
    again = _attack(attack.name, seed=1)(predictor, x, y, eps)
    assert torch.equal(again.x_adv.cpu(), result.x_adv.cpu()), "not deterministic"
    if attack.chunk_independent:  # chunks of 3: each sample's result as in the whole batch
        chunked = _attack(attack.name, seed=1)(predictor, x, y, eps, chunk_size=3)
        assert torch.equal(chunked.steps.cpu(), result.steps.cpu()), "chunk-dependent steps"
        assert torch.equal(chunked.success.cpu(), result.success.cpu()), "chunk-dependent"
        torch.testing.assert_close(chunked.x_adv.cpu(), result.x_adv.cpu(), rtol=0, atol=1e-5)
    if attack.skips_misclassified:  # wrong already: left clean, no query spent
        wrong = (result.clean_logits.argmax(1) != result.y).cpu()
        assert torch.equal(result.x_adv.cpu()[wrong], x[wrong])
        assert (result.steps.cpu()[wrong] == 0).all()
    target = (y + 1) % predictor.num_classes
    if attack.supports_targets():
        assert attack.targeted
        aimed = _attack(attack.name, seed=1)(predictor, x, y, eps, target=target)
        assert torch.equal(aimed.target.cpu(), target)
    else:
        with pytest.raises(InputError, match="untargeted only"):
            attack(predictor, x, y, eps, target=target)


@pytest.mark.parametrize("name", names("attack"))
def test_attack_with_zero_budget_changes_nothing(name, zoo_predictor, batch):
    x, y = batch
    result = _attack(name)(zoo_predictor, x, y, 0.0)
    assert torch.equal(result.x_adv.cpu(), x)
    assert torch.equal(result.success.cpu(), zoo_predictor.predict(x).cpu() != y)


# --- input defenses -----------------------------------------------------------------------


# Defenses whose transform leaves [0, 1] by design, each with its reason.
UNBOXED = {
    # Cohen et al.'s certificate needs pure Gaussian noise: the noisy copy is not clipped.
    "randomized-smoothing",
}


@pytest.mark.parametrize("name", names("defense"))
def test_input_defense_contract(name, zoo_predictor, batch):
    x, _ = batch
    cls = REGISTRY.get("defense", name)
    described = cls.describe()
    assert described["name"] == name and described["kind"] == "input" and described["description"]

    def defended():
        return REGISTRY.create("defense", name, {}, zoo_predictor)

    first = defended()
    assert first.capabilities == zoo_predictor.capabilities
    assert tuple(first.input_shape) == tuple(zoo_predictor.input_shape)
    view = first.transform(x.clone())
    assert view.shape == x.shape and view.dtype == x.dtype, "transform must keep the shape"
    assert torch.isfinite(view).all()
    if name not in UNBOXED:
        assert view.min() >= 0 and view.max() <= 1, "transform must stay in [0, 1]"
    logits = defended().logits(x)
    assert logits.shape == (N, zoo_predictor.num_classes) and torch.isfinite(logits).all()
    assert torch.equal(defended().logits(x), logits), "not deterministic with a fixed seed"


# --- training defenses --------------------------------------------------------------------


def _tiny_network(architecture: str | None = None) -> torch.nn.Module:
    """mnist-cnn, or the architecture a defense needs (pixel input: the thermometer's)."""
    torch.manual_seed(0)
    if architecture is None:
        return torch.nn.Sequential(Normalize((0.1307,), (0.3081,)), build("mnist-cnn"))
    return torch.nn.Sequential(Normalize((0.0,), (1.0,)), build(architecture))


def _loss(name: str, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.nn.Module]:
    cls = REGISTRY.get("training_defense", name)
    defense = REGISTRY.create("training_defense", name, fast_config(cls))
    network = _tiny_network(cls.architecture)
    defense.prepare(network, lambda net, stage: None)  # no extra training stage here
    step = TrainingStep(0.5, 2, torch.Generator().manual_seed(0))
    return defense.loss(network.train(), x, y, step), network


@pytest.mark.parametrize("name", names("architecture"))
def test_architecture_contract(name, tmp_path):
    """A registered architecture builds a fresh module that takes its ``input_shape`` and
    gives ``num_classes`` logits, and a plan that names it (``source: checkpoint``) loads a
    state dict into it and computes what the module computes on the record's normalisation."""
    from aisafety.interfaces import Architecture, ModelSpec
    from aisafety.loading import load_model

    record = REGISTRY.get("architecture", name)
    assert isinstance(record, Architecture) and record.name == name
    torch.manual_seed(0)
    module = record.factory()
    assert isinstance(module, torch.nn.Module), f"{name}: factory gave {type(module)}"
    assert record.factory() is not module  # a fresh module per call: models never share weights
    x = torch.rand(3, *record.input_shape, generator=torch.Generator().manual_seed(1))
    inputs = x
    if record.mean is not None:
        mean = torch.tensor(record.mean).view(-1, 1, 1)
        inputs = (x - mean) / torch.tensor(record.std).view(-1, 1, 1)
    with torch.no_grad():
        expected = module.eval()(inputs)
    assert expected.shape == (3, record.num_classes) and torch.isfinite(expected).all()
    path = tmp_path / "weights.pt"
    torch.save(module.state_dict(), path)
    spec = ModelSpec(name=f"{name}-contract", source="checkpoint", path=path, architecture=name)
    predictor, fingerprint = load_model(spec, torch.device("cpu"), REGISTRY)
    assert predictor.num_classes == record.num_classes and len(fingerprint) == 64
    with torch.no_grad():
        torch.testing.assert_close(predictor.logits(x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", names("training_defense"))
def test_training_defense_contract(name, batch):
    x, y = batch
    described = REGISTRY.get("training_defense", name).describe()
    assert described["name"] == name and described["kind"] == "training"
    assert described["description"]
    loss, network = _loss(name, x, y)
    assert loss.shape == () and torch.isfinite(loss), "the loss is one finite number"
    loss.backward()
    grads = [p.grad for p in network.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads), "no finite gradient"
    assert torch.equal(_loss(name, x, y)[0].detach(), loss.detach()), "not deterministic"


# --- metrics ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def metric_context(zoo_predictor, mnist_subset):
    data, profile = mnist_subset(N), mnist_subset(20, seed=1)

    def make_attack(spec: AttackSpec):
        return REGISTRY.create("attack", spec.name, spec.config)

    return EvaluationContext(
        zoo_predictor,
        data,
        make_attack,
        batch_size=4,
        reference=zoo_predictor,
        load_profile=lambda: profile,
    )


ATTACK = AttackSpec(name="pgd-linf", config={"steps": 3}, eps=0.3)
BOUNDED = {"fraction", "fraction of neurons", "probability"}


def _compute(metric: Metric, ctx: EvaluationContext) -> list[MetricValue]:
    if isinstance(metric, CleanMetric):
        values = metric.compute(ctx)
    else:
        values = metric.compute(ctx, ATTACK, 0.3)
    assert isinstance(values, list), f"compute returned {type(values).__name__}, not a list"
    assert all(isinstance(v, MetricValue) for v in values)
    return values


@pytest.mark.parametrize("name", names("metric"))
def test_metric_contract(name, metric_context):
    cls = REGISTRY.get("metric", name)
    described = cls.describe()
    assert described["name"] == name and described["description"] and described["unit"]
    assert isinstance(cls.direction, Direction)
    metric = REGISTRY.create("metric", name, fast_config(cls, METRIC_FAST))
    assert isinstance(metric, CleanMetric) != isinstance(metric, AttackMetric), "one kind only"
    values = _compute(metric, metric_context)
    assert values
    for v in values:
        assert v.metric.startswith(name) and v.direction is cls.direction and v.unit == cls.unit
        assert v.n_samples >= 0
        if v.n_samples and not v.details.get("undefined"):  # NaN only when it says why
            assert math.isfinite(v.value), f"{v.metric} = {v.value} on {v.n_samples} samples"
        if cls.unit in BOUNDED and math.isfinite(v.value):
            assert 0 <= v.value <= 1, f"{v.metric} = {v.value} is no {cls.unit}"
        if isinstance(metric, AttackMetric):
            assert v.attack == ATTACK.label and v.eps == 0.3
        else:
            assert v.attack is None
    again = _compute(REGISTRY.create("metric", name, fast_config(cls, METRIC_FAST)), metric_context)
    assert [v.value for v in again] == [v.value for v in values] or all(
        math.isnan(a.value) and math.isnan(b.value) for a, b in zip(again, values, strict=True)
    ), "not deterministic"


# --- verifiers -----------------------------------------------------------------------------
#
# Every registered verifier runs on every small net its ``check`` accepts (a ReLU net, and a
# sigmoid/tanh one for those that bound them) and must be sound there: its bound of every
# spec row below the row's value at the box centre, at 400 sampled points and at box-PGD's
# best point; no certified sample broken by the ``standard`` attack; every falsified
# sample's counterexample replaying; and its margin never below a verifier it declares
# itself at least as tight as (``tighter_than``), sample by sample.

# LP-based bounds are moved outwards by the solver's tolerance (at most 1e-5 (1 + |b|))
NESTING_SLACK = 1e-4
SOUND_SLACK = 1e-6


def _scaled(net: torch.nn.Module, factor: float) -> torch.nn.Module:
    """``net`` with every parameter times ``factor``: steep enough that some samples break."""
    with torch.no_grad():
        for parameter in net.parameters():
            parameter.mul_(factor)
    return net.eval()


def _relu_net() -> torch.nn.Module:
    return scaled_mlp(2, 2.0, [16, 10, 10, 3], [torch.nn.ReLU] * 2)


def _pooled_net() -> torch.nn.Module:
    """Conv-ReLU-max-pool: the LP/MILP max-pooling rows and its DeepPoly lines (issue 32)."""
    torch.manual_seed(4)
    return _scaled(torch.nn.Sequential(
        torch.nn.Conv2d(1, 3, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(12, 3),
    ), 2.0)  # fmt: skip


class VerifierProblem:
    """A (steep, tiny) net, its bound graph, 6 inputs robust around its own predictions at
    one radius, and the lowest value of each spec row found at the centre, at sampled
    points and at box-PGD's point."""

    def __init__(self, make, eps: float):
        self.net = make()
        self.graph = build_graph(self.net, (1, 4, 4), make.__name__)
        self.predictor = TorchPredictor(self.net, (1, 4, 4), 3, name=make.__name__)
        generator = torch.Generator().manual_seed(3)
        self.x = torch.rand(6, 1, 4, 4, generator=generator)
        with torch.no_grad():
            self.y = self.net(self.x).argmax(1)
        self.eps = eps
        self.prop = robustness_property(self.x, self.y, eps, 3)
        lower, upper = self.prop.lower.float(), self.prop.upper.float()
        points = [self.x, pgd_on_rows(self.net, self.prop, steps=30, restarts=2)]
        noise = torch.rand(400, *self.x.shape, generator=generator)
        points += list(lower + noise * (upper - lower))
        with torch.no_grad():
            values = [self.prop.rows(self.net(p).double()) for p in points]
        self.lowest_rows = torch.stack(values).amin(0)  # (B, K)
        self.results: dict[str, object] = {}  # the default registry's verify, by verifier

    @functools.cached_property
    def broken(self) -> torch.Tensor:
        """Which samples the seeded ``standard`` attack breaks: it depends on the problem only,
        so it runs once per problem, not once per verifier that certifies something."""
        attack = REGISTRY.create("attack", "standard", {"steps": 10, "queries": 100, "seed": 0})
        return attack(self.predictor, self.x, self.y, self.eps).success.cpu()


@pytest.fixture(scope="module")
def verifier_problems() -> list[VerifierProblem]:
    # radii with certified, falsified and unknown samples for most verifiers
    problems = [(_relu_net, 0.05), (_relu_net, 0.1), (smooth_net, 0.05), (_pooled_net, 0.05)]
    return [VerifierProblem(make, eps) for make, eps in problems]


def _verifier(registry, name: str):
    return make_verifier(registry, name, fast_config(registry.get("verifier", name)))


def _verified(registry, name: str, problem: VerifierProblem):
    """``name``'s ``verify`` on ``problem``. For the default registry it runs once per
    problem: a verifier's own contract run and those of the verifiers declaring themselves
    tighter than it ran the same verifier, config and inputs again."""
    if registry is REGISTRY and name in problem.results:
        return problem.results[name]
    result = _verifier(registry, name).verify(problem.graph, problem.prop, problem.predictor.logits)
    if registry is REGISTRY:
        problem.results[name] = result
    return result


def _accepts(verifier, problem: VerifierProblem) -> bool:
    try:
        verifier.check(problem.graph)
    except VerificationError:
        return False
    return True


def check_verifier_contract(registry, name: str, problems: list[VerifierProblem]) -> None:
    """Assert the verifier contract of ``registry``'s verifier ``name`` on ``problems``."""
    cls = registry.get("verifier", name)
    described = cls.describe()
    assert described["name"] == name and described["description"], "describe() incomplete"
    verifier = _verifier(registry, name)
    ran = [p for p in problems if _accepts(verifier, p)]
    assert ran, f"verifier {name!r} accepts none of the contract's nets"
    for problem in ran:
        prop = problem.prop.to(problem.graph.dtype)
        with torch.no_grad():
            bounds = verifier.lower_bounds(problem.graph, prop)[0] + prop.offset
        over = bounds - problem.lowest_rows
        assert (over <= SOUND_SLACK).all(), (
            f"{name}: bound above a row's value in the box by {over.max():.3g} "
            f"({problem.graph.model}, eps {problem.eps})"
        )
        result = _verified(registry, name, problem)
        _check_verdicts(name, result, problem)
        for other in cls.tighter_than:
            if not _accepts(_verifier(registry, other), problem):
                continue  # e.g. 'wk' has no max-pooling rule: nothing to compare with
            theirs = _verified(registry, other, problem)
            settled = ~result.timeouts & ~theirs.timeouts
            assert not (settled & theirs.certified & ~result.certified).any(), (
                f"{name} declares itself at least as tight as {other} but leaves open a "
                f"sample {other} certifies ({problem.graph.model})"
            )
            # a falsified sample's margin is its counterexample's value, not a bound
            bounded = settled & ~result.falsified & ~theirs.falsified
            gap = (theirs.margins - result.margins)[bounded]
            assert (gap <= NESTING_SLACK * (1 + theirs.margins[bounded].abs())).all(), (
                f"{name} declares itself at least as tight as {other} but is looser by "
                f"{gap.max():.3g} ({problem.graph.model})"
            )


def _check_verdicts(name: str, result, problem: VerifierProblem) -> None:
    assert len(result) == len(problem.x)
    open_ = ~result.falsified & ~result.timeouts
    lowest = problem.lowest_rows.amin(1).float()
    over = (result.margins - lowest)[open_]
    assert (over <= SOUND_SLACK).all(), (
        f"{name}: margin above the box's minimum by {over.max():.3g}"
    )
    if result.falsified.any():
        cex = result.counterexamples[result.falsified]
        assert replay(problem.predictor.logits, problem.prop[result.falsified], cex).all(), (
            f"{name}: a falsified sample's counterexample does not replay"
        )
    if result.certified.any():
        broken = problem.broken
        assert not (broken & result.certified).any(), f"{name}: a certified sample is broken"


@pytest.mark.parametrize("name", names("verifier"))
def test_verifier_soundness_contract(name, verifier_problems):
    check_verifier_contract(REGISTRY, name, verifier_problems)


class _BadVerifiers:
    """A plugin with two wrong verifiers: CROWN with its bound moved up by 0.2 (unsound),
    and IBP declaring itself at least as tight as CROWN (a false nesting)."""

    @staticmethod
    @hookimpl
    def aisafety_verifiers() -> list[type]:
        class ShiftedCrown(CrownVerifier):
            name = "shifted-crown"
            description = "CROWN plus 0.2: deliberately unsound (the contract's own test)"
            tighter_than = ()

            def lower_bounds(self, graph, prop):
                bound, coeff = super().lower_bounds(graph, prop)
                return bound + 0.2, coeff

        class BoastingIbp(IBPVerifier):
            name = "boasting-ibp"
            description = "IBP claiming CROWN's tightness (the contract's own test)"
            tighter_than = ("crown",)

        return [ShiftedCrown, BoastingIbp]


@pytest.mark.parametrize(
    "name, failure", [("shifted-crown", "shifted-crown: bound above"),
                      ("boasting-ibp", "boasting-ibp declares itself at least as tight as crown")],
)  # fmt: skip
def test_the_verifier_contract_fails_a_wrong_plugin_verifier(name, failure, verifier_problems):
    registry = build_registry([("bad-verifiers", _BadVerifiers)])
    assert name in registry.names("verifier"), registry.failures
    with pytest.raises(AssertionError, match=failure):
        check_verifier_contract(registry, name, verifier_problems)


# --- verifiers: bounds on a ten-class net ---------------------------------------------


@pytest.fixture(scope="module")
def tiny_property():
    """A seeded 16-12-10 ReLU network and 6 points labelled by it, at two radii."""
    torch.manual_seed(0)
    network = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(16, 12), torch.nn.ReLU(), torch.nn.Linear(12, 10)
    )
    x = torch.rand(6, 1, 4, 4, dtype=torch.float64)
    exact = copy.deepcopy(network).double()  # the values the float64 bounds are held to
    y = exact(x).argmax(1)
    return network, exact, x, y


@pytest.mark.parametrize("name", names("verifier"))
@pytest.mark.parametrize("eps", [0.01, 0.1])
def test_verifier_contract(name, eps, tiny_property):
    """Sound: the proved lower bound of the smallest spec row is never above its value at
    any point of the box (centre, random points); nothing certified is also violated."""
    cls = REGISTRY.get("verifier", name)
    described = cls.describe()
    assert described["name"] == name and described["description"]
    network, exact, x, y = tiny_property
    graph = build_graph(network, (1, 4, 4), "tiny")
    prop = robustness_property(x, y, eps, 10)
    verifier = REGISTRY.create("verifier", name, fast_config(cls, timeout=600.0, clock="cpu"))
    result = verifier.verify(graph, prop)
    assert len(result) == len(x) and set(result.verdicts) <= set(Verdict)
    generator = torch.Generator().manual_seed(1)
    points = [(prop.lower + prop.upper) / 2, prop.lower, prop.upper]
    points += [
        prop.lower + (prop.upper - prop.lower) * torch.rand(x.shape, generator=generator)
        for _ in range(64)
    ]
    with torch.no_grad():
        smallest = torch.stack([prop.rows(exact(p)).amin(1) for p in points]).amin(0)
    assert bool((result.margins.double() <= smallest + 1e-9).all()), (
        f"{name} proved a bound above a value it takes: {result.margins} vs {smallest}"
    )
    assert not bool((result.certified & (smallest <= 0)).any()), f"{name} certified a violation"
