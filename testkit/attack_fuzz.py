"""Soundness fuzzing of the attack side: every registered attack's returned points, and the
invariant between certificates and attacks (docs/attacks.md, "Fuzzing the attacks").

A case is a small random float32 image classifier (testkit/verifier_fuzz.py's layers: dense,
convolutional with stride, padding and dilation, max/average pooling, BatchNorm, a residual
block, ReLU/sigmoid/tanh, one layer's weights scaled by up to 1e3 or down to 1e-3), a third
of the time behind a deterministic input defense (bit depth, JPEG, median filter, spatial
smoothing; BPDA and EOT drawn), 4-7 images (some pixels at 0 and 1 exactly; a quarter of the
labels random, so some clean mistakes) and one l-inf budget. Every attack runs at that budget
and, for l2 and l1 attacks, at a budget of their own scale. On every result:

- each returned point lies in [0, 1] and in the eps-ball of the attack's norm (float64 size
  at most ``eps (1 + 1e-5) + 1e-6``, the contract's tolerance; the exact excess is kept);
- the result's inputs, labels and clean logits are the caller's;
- ``success`` is ``adv_logits.argmax(1) != y``, and it replays: a fresh forward pass of the
  returned points, in their batch and one at a time, gives the same class decision (a flip is
  told apart from a tie: a top-two gap under ``TIE`` of the logits' size or twice their
  spread over the three passes);
- no sample the model gets wrong clean comes back classified correctly, so robust accuracy
  never exceeds clean accuracy; the reported rates equal a recount of the per-sample outcomes.

Then, undefended cases only, every verifier that takes the graph runs on the l-inf property
at the case's budget: a certified sample must be classified correctly and no attack at that
budget, of any norm (the l2 and l1 balls of radius eps lie inside the l-inf one), may have
broken it with a replayed point inside the float64 box, nor falsified by another verifier.
Shared by the bench (bench/attack_fuzz.py, many seeds) and the test slice
(tests/test_attack_fuzz.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from verifier_fuzz import (
    FAST,
    Finding,
    choice,
    conv_layers,
    dense_layers,
    seeded_weights,
    uniform,
)

from aisafety.attack.result import AttackResult
from aisafety.interfaces import Norm
from aisafety.prediction.base import Predictor
from aisafety.prediction.torch_module import TorchPredictor
from aisafety.verification.graph import VerificationError, build_graph
from aisafety.verification.property import robustness_property
from aisafety.verification.result import VerificationResult

# shorter runs only, applied where an attack's Config has the field
ATTACK_FAST = {
    "steps": 5,
    "queries": 60,
    "iterations": 5,
    "population": 16,
    "binary_search_steps": 2,
    "init_draws": 40,
    "init_search_steps": 3,
    "samples": 16,
    "nb_samples_per_step": 8,
    "draws": 5,
    "n_restarts": 1,
    "attack_config": {"steps": 3},
}
# the defenses whose transform is deterministic (no draw): the replay must agree with them
DEFENSES = ("bit-depth", "jpeg", "median-filter", "spatial-smoothing")
LINF_EPS = (0.0, 1e-3, 0.01, 0.03, 0.1, 0.3, 1.0)
OWN_EPS = {Norm.L2: (0.05, 0.3, 1.0, 3.0), Norm.L1: (0.1, 1.0, 5.0, 20.0)}
# a replay whose top-two gap is below TIE * (1 + |logits|), or twice the spread of the
# point's logits over its passes (stored, in its batch, alone), is a rounding tie
TIE = 1e-5
# findings that are float32 rounding, not a wrong answer (docs/attacks.md, "Fuzzing the
# attacks"): a class decided by a float32 tie moves with the batch; a certificate is of the
# network in exact arithmetic, which a margin below the float32 network's rounding separates;
# an l-inf point may lie one float32 step outside the float64 box a verifier certified
ROUNDING = (
    "replay flips at a tie",
    "certified sample broken in float32 only",
    "certified a clean mistake of float32 only",
    "broken only outside the box",
    "certified and falsified in float32 only",
)
# with ``float32="rigorous"`` a certificate is of the float32 network itself: its float32-only
# contradictions are findings, under the plain kinds (ROUNDING keeps the other two)
FLOAT32_ONLY = (" in float32 only", " of float32 only")
SIZE = {
    Norm.LINF: lambda d: d.abs().amax(1),
    Norm.L2: lambda d: d.norm(dim=1),
    Norm.L1: lambda d: d.abs().sum(1),
}


@dataclass
class AttackCase:
    """One case: the network, the predictor attacked (defended or not), images, labels and
    the l-inf budget every attack runs at."""

    seed: int
    net: nn.Module
    predictor: Predictor
    x: torch.Tensor
    y: torch.Tensor
    eps: float
    defended: bool
    what: str
    own: dict[Norm, float]  # the l2 and l1 attacks' budgets of their own scale


def random_image_net(gen: torch.Generator) -> tuple[nn.Module, tuple[int, int, int], str]:
    """A small random float32 classifier of (C, H, W) images in [0, 1]."""
    relu_only = uniform(gen) < 0.5
    classes = int(torch.randint(2, 6, (1,), generator=gen))
    what = ["relu" if relu_only else "mixed-act"]
    shape = (choice(gen, [1, 1, 3]),) + (int(torch.randint(4, 9, (1,), generator=gen)),) * 2
    mnist = uniform(gen) < 0.1  # the transfer attack's zoo surrogate: MNIST's shape, classes
    if mnist:
        shape, classes = (1, 28, 28), 10
    if mnist or uniform(gen) < 0.35:
        width = shape[0] * shape[1] * shape[2]
        layers = [nn.Flatten(), *dense_layers(gen, width, classes, relu_only, what)]
        what.insert(0, "dense")
    else:
        body, width = conv_layers(gen, shape, relu_only, what)
        layers = [*body, nn.Flatten(), *dense_layers(gen, width, classes, relu_only, what)]
        what.insert(0, "conv")
    net = seeded_weights(nn.Sequential(*layers), gen, what)
    _balance(net, shape, gen)
    return net, shape, " ".join(what)


def _balance(net: nn.Module, shape: tuple[int, ...], gen: torch.Generator) -> None:
    """Shift the last layer's bias so that every class is the median logit's winner as
    often: a random net is otherwise often one class everywhere, which no attack can break
    and every verifier certifies."""
    with torch.no_grad():
        logits = net(torch.rand(256, *shape, generator=gen))
        net[-1].bias -= logits.median(0).values


def random_case(seed: int, registry, defended: float = 1 / 3) -> AttackCase:
    gen = torch.Generator().manual_seed(seed)
    net, shape, what = random_image_net(gen)
    classes = net[-1].out_features
    predictor: Predictor = TorchPredictor(net, shape, classes, name=f"fuzz{seed}")
    n = int(torch.randint(4, 8, (1,), generator=gen))
    x = torch.rand(n, *shape, generator=gen)
    x[torch.rand(x.shape, generator=gen) < 0.1] = 0.0  # saturated pixels at both ends
    x[torch.rand(x.shape, generator=gen) < 0.1] = 1.0
    with torch.no_grad():
        y = predictor.logits(x).argmax(1)
    wrong = torch.rand(n, generator=gen) < 0.25
    y[wrong] = torch.randint(classes, (int(wrong.sum()),), generator=gen)
    is_defended = uniform(gen) < defended
    if is_defended:
        name = choice(gen, DEFENSES)
        config = {"bpda": uniform(gen) < 0.5, "eot_samples": choice(gen, [1, 1, 2])}
        predictor = registry.create("defense", name, config, predictor)
        what += f" +{name}" + (" bpda" if config["bpda"] else "")
    eps = choice(gen, LINF_EPS)
    own = {norm: choice(gen, options) for norm, options in OWN_EPS.items()}
    return AttackCase(seed, net, predictor, x, y, eps, is_defended, f"{what} n={n}", own)


def make_attack(registry, name: str, seed: int):
    cls = registry.get("attack", name)
    fields = getattr(cls.Config, "model_fields", {})
    config = {k: v for k, v in ATTACK_FAST.items() if k in fields}
    if "early_stop" in fields:
        config["early_stop"] = bool(seed % 2)
    if "random_start" in fields:
        config["random_start"] = bool(seed % 3)
    return registry.create("attack", name, {**config, "seed": seed})


def budgets(case: AttackCase, norm: Norm) -> list[float]:
    """The case's l-inf budget (for the certificate check), and one of the norm's own scale."""
    if norm is Norm.LINF:
        return [case.eps]
    return list(dict.fromkeys([case.eps, case.own[norm]]))


def check_result(case: AttackCase, result: AttackResult, note: Callable[[str, str], None]):
    """The invariants of one attack result; ``note(kind, detail)`` records a broken one.
    Returns the largest float64 excess of a point's size over eps (0 inside the ball)."""
    x, y, eps, norm = case.x, case.y, result.eps, result.norm
    if not (torch.equal(result.x, x) and torch.equal(result.y, y)):
        note("inputs changed", "the result's x or y is not the caller's")
    adv = result.x_adv
    if not bool(torch.isfinite(adv).all()) or adv.min() < 0 or adv.max() > 1:
        note("outside [0, 1]", f"min {float(adv.min()):.9g} max {float(adv.max()):.9g}")
    size = SIZE[norm]((adv.double() - x.double()).flatten(1))
    excess = float((size - eps).max()) if len(size) else 0.0
    if bool((size > eps * (1 + 1e-5) + 1e-6).any()):
        note("over budget", f"{norm.value} size {float(size.max()):.9g} > eps {eps:g}")
    with torch.no_grad():
        clean = case.predictor.logits(x)
        batched = case.predictor.logits(adv)
        alone = torch.cat([case.predictor.logits(adv[i : i + 1]) for i in range(len(adv))])
    if not torch.allclose(result.clean_logits, clean, rtol=1e-5, atol=1e-5):
        note("clean logits", "the result's clean logits are not the model's")
    success = result.success.bool()
    if not torch.equal(success, result.adv_logits.argmax(1) != y):
        note("success miscounted", f"success {success.tolist()} adv_pred {result.adv_pred}")
    for where, logits in (("in its batch", batched), ("alone", alone)):
        replayed = logits.argmax(1) != y
        for i in torch.nonzero(replayed != success).flatten().tolist():
            top = logits[i].topk(2).values
            # the point's logits by three passes (stored, batched, alone) differ by the
            # network's float32 rounding; a gap within twice that is a tie
            passes = torch.stack([result.adv_logits[i], batched[i], alone[i]])
            spread = float((passes.amax(0) - passes.amin(0)).max())
            scale = TIE * (1 + float(logits[i].abs().max()))
            tie = float(top[0] - top[1]) <= 2 * spread + scale
            kind = "replay flips at a tie" if tie else "replay disagrees"
            note(kind, f"sample {i} {where}: reported {bool(success[i])}, logits "
                       f"{logits[i].tolist()} stored {result.adv_logits[i].tolist()}")  # fmt: skip
    clean_wrong = result.clean_logits.argmax(1) != y
    for i in torch.nonzero(clean_wrong & ~success).flatten().tolist():
        note("clean mistake made correct", f"sample {i}: label {int(y[i])}, clean "
             f"{int(result.clean_pred[i])}, returned point {int(result.adv_pred[i])}")  # fmt: skip
    clean_acc = float((~clean_wrong).double().mean())
    if result.robust_accuracy > clean_acc:
        note("robust above clean", f"{result.robust_accuracy:.4g} > {clean_acc:.4g}")
    if result.success_rate != float(success.double().mean()) or result.robust_accuracy != float(
        (~success).double().mean()
    ):
        note("rates miscounted", f"{result.success_rate} / {result.robust_accuracy}")
    _check_members(result, note)
    return max(excess, 0.0)


def _check_members(result: AttackResult, note: Callable[[str, str], None]) -> None:
    """An ensemble's per-sample record: a member named as the breaker ran on the sample and
    the sample is broken."""
    if result.broken_by is None:
        return
    broken_by = result.broken_by
    named = broken_by >= 0
    if bool((named & ~result.success.bool()).any()):
        note("breaker of a robust sample", f"broken_by {broken_by.tolist()} "
             f"success {result.success.tolist()}")  # fmt: skip
    if result.member_attacked is not None:
        rows = torch.nonzero(named).flatten()
        ran = result.member_attacked[rows, broken_by[rows]]
        if not bool(ran.all()):
            note("breaker did not run", f"broken_by {broken_by.tolist()}")


def certificates(
    registry, case: AttackCase, names: list[str], float32: str = "exact"
) -> dict[str, VerificationResult]:
    """Per verifier that takes the case's graph (with the ``float32`` setting), its result
    at the case's budget."""
    if case.defended:
        return {}
    graph = build_graph(case.predictor.network, case.predictor.input_shape, case.what)
    prop = robustness_property(case.x, case.y, case.eps, case.predictor.num_classes)
    found = {}
    for name in names:
        cls = registry.get("verifier", name)
        fields = getattr(cls.Config, "model_fields", {})
        config = {k: v for k, v in FAST.items() if k in fields}
        if float32 != "exact":  # a plugin's own Config may not have the setting
            config["float32"] = float32
        verifier = registry.create("verifier", name, config)
        try:
            verifier.check(graph)
        except VerificationError:
            continue
        found[name] = verifier.verify(graph, prop, case.predictor.network)
    return found


def check_verdicts_agree(
    case: AttackCase, results: dict[str, VerificationResult], note: Callable[[str, str], None]
) -> None:
    """No sample certified by one verifier and falsified by another; where the falsifying
    point keeps the label in the float64 network, the contradiction is float32 rounding
    (the replay counts a float32 tie, margin 0, as a counterexample)."""
    if not results:
        return
    exact = copy.deepcopy(case.predictor.network).double()
    classes = case.predictor.num_classes
    for proved, proof in results.items():
        for refuted, refutation in results.items():
            both = proof.certified.bool() & refutation.falsified.bool()
            for i in torch.nonzero(both).flatten().tolist():
                point = refutation.counterexamples[i : i + 1].double()
                with torch.no_grad():
                    logits = exact(point)[0]
                others = logits[torch.arange(classes) != case.y[i]]
                kept = bool(logits[case.y[i]] > others.max())
                kind = "certified and falsified" + (" in float32 only" if kept else "")
                note(kind, f"sample {i}: {proved} certified, {refuted} falsified")


def check_certified(
    case: AttackCase,
    certified: dict[str, torch.Tensor],
    results: dict[str, AttackResult],
    note: Callable[[str, str], None],
) -> int:
    """No certified sample is misclassified, nor broken by an attack at the case's budget
    with a point inside the verifier's float64 box (a replayed point: the results are
    checked to replay by ``check_result``). A certificate is of the network in exact
    arithmetic (docs/own-model.md), so where the float32 network's class differs from the
    float64 network's at that point, the contradiction is told apart as rounding. Returns
    the number of (certified sample, attack) pairs checked."""
    if not certified:
        return 0
    pairs = 0
    lower = (case.x.double() - case.eps).clamp(0, 1)
    upper = (case.x.double() + case.eps).clamp(0, 1)
    exact = copy.deepcopy(case.predictor.network).double()
    with torch.no_grad():
        clean_wrong = case.predictor.logits(case.x).argmax(1) != case.y
        clean_wrong64 = exact(case.x.double()).argmax(1) != case.y
    for verifier, mask in certified.items():
        for i in torch.nonzero(mask & clean_wrong).flatten().tolist():
            kind = "certified a clean mistake"
            note(kind if clean_wrong64[i] else f"{kind} of float32 only", f"{verifier}: sample {i}")
        for attack, result in results.items():
            adv = result.x_adv.double()
            inside = ((adv >= lower) & (adv <= upper)).flatten(1).all(1)
            with torch.no_grad():
                wrong64 = exact(adv).argmax(1) != case.y
            pairs += int(mask.sum())
            for i in torch.nonzero(mask & result.success.bool()).flatten().tolist():
                if not inside[i]:
                    kind = "broken only outside the box"
                elif not wrong64[i]:
                    kind = "certified sample broken in float32 only"
                else:
                    kind = "certified sample broken"
                note(kind, f"{verifier} certified sample {i}, {attack} broke it")
    return pairs


def fuzz_case(
    registry,
    seed: int,
    attacks: list[str],
    verifiers: list[str],
    defended: float = 1 / 3,
    errors: Callable[[str, Exception], None] | None = None,
    float32: str = "exact",
) -> tuple[AttackCase, list[Finding], dict]:
    """Every attack (and verifier) on case ``seed``: its findings and what ran (attack runs,
    certified counts per verifier, the largest excess over a budget per norm). ``float32``:
    the verifiers' setting; with "rigorous" a certificate contradicted in float32 only is a
    finding of the plain kind (the certificate is of the float32 network)."""
    case = random_case(seed, registry, defended)
    found: list[Finding] = []
    ran: dict = {"attacks": 0, "broken": 0, "certified": {}, "excess": {}, "pairs": 0}
    at_case_eps: dict[str, AttackResult] = {}
    for name in attacks:
        attack = make_attack(registry, name, seed)
        if not _fits(attack, case):
            continue
        for eps in budgets(case, attack.norm):

            def note(kind: str, detail: str, where=f"{name}@{eps:g}") -> None:
                found.append(Finding(seed, where, kind, detail))

            try:
                result = attack(case.predictor, case.x, case.y, eps)
            except Exception as exc:  # noqa: BLE001 - a crash is listed, not a finding
                if errors is None:
                    raise
                errors(name, exc)
                continue
            ran["attacks"] += 1
            ran["broken"] += int(result.success.sum())
            excess = check_result(case, result, note)
            key = attack.norm.value
            ran["excess"][key] = max(ran["excess"].get(key, 0.0), excess)
            if eps == case.eps:
                at_case_eps[name] = result
    results = certificates(registry, case, verifiers, float32)
    certified = {k: r.certified.bool() for k, r in results.items()}
    ran["certified"] = {k: int(v.sum()) for k, v in certified.items()}

    def note_certified(kind: str, detail: str) -> None:
        if float32 == "rigorous":
            for tail in FLOAT32_ONLY:
                kind = kind.removesuffix(tail)
        found.append(Finding(seed, "certificate", kind, detail))

    ran["pairs"] = check_certified(case, certified, at_case_eps, note_certified)
    check_verdicts_agree(case, results, note_certified)
    return case, found, ran


def _fits(attack, case: AttackCase) -> bool:
    """Whether ``attack`` can run on the case: the transfer attack's zoo surrogate (an MNIST
    model) takes only MNIST's input shape and classes."""
    if getattr(attack.config, "surrogate", None) is None:
        return True
    return tuple(case.predictor.input_shape) == (1, 28, 28) and case.predictor.num_classes == 10
