"""One VNN-COMP instance (ONNX network + VNN-LIB property) -> sat / unsat / timeout / unknown.

Everything happens in the network's own input space, where VNN-LIB boxes lie (normalised
inputs for the CIFAR ResNets, channels-last [0, 1] pixels for the Marabou nets, anything):
the bounds run on the onnx2torch conversion (checked against onnxruntime at load time), and
counterexample candidates are replayed through onnxruntime on the file as shipped, without
the platform's [0, 1] check. ``sat`` comes with the counterexample in VNN-COMP's format:
``((X_0 v) ... (Y_0 v) ...)``.

A disjunct that is a conjunction of several output atoms (Marabou's targeted properties:
``Y_t >= Y_j`` for every j) is refuted when one of its atoms is certified never to hold on
the box (each atom is verified on its own, most promising first, until a search of one
stops improving or stands below the joint search's probe at the same age: ``stall.py``),
else, with a complete verifier of the ``bab`` family on a ReLU network, by branch and
bound over all its atoms together (a probe of ``PROBE_SHARE`` first, then the time left)
(``conjunction_search.py``: a domain is pruned when any atom's bound is > 0 there); it is
falsified by a point where all its atoms hold (box-PGD on the largest of their rows, then
on their logsumexp, on every disjunct before any bound work; a complete verifier's
counterexample to one atom, or the joint search's, replayed through onnxruntime). Its
margin: docs/certification.md.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from aisafety.errors import ConfigError
from aisafety.prediction.onnx_model import OnnxRuntimePredictor, load_onnx
from aisafety.verification.bab import BabVerifier
from aisafety.verification.base import AttackFirstConfig, Verifier, VerifierConfig
from aisafety.verification.complete import MIP_NOTE
from aisafety.verification.conjunction_search import (
    ConjunctionSearch,
    JointOutcome,
    all_hold,
    max_row_losses,
    one_row,
)
from aisafety.verification.deadline import CLOCKS, OutOfTime, time_limit
from aisafety.verification.falsify import checked, into_box, pgd_on_rows
from aisafety.verification.float64_margin import added_down
from aisafety.verification.graph import BoundGraph, VerificationError, build_graph
from aisafety.verification.input_space import (
    InputRange,
    check_box,
    check_centre_class,
    declared_range,
    graph_range,
)
from aisafety.verification.property import Property
from aisafety.verification.registry import PluginRegistry, make_verifier
from aisafety.verification.result import Verdict
from aisafety.verification.stall import StallWatch, watching
from aisafety.verification.vnnlib import Row, read_disjuncts

# the conjunction attack's second box-PGD: (steps, restarts) on the rows' logsumexp
SMOOTH_PGD = (100, 30)
# the conjunction attack's stages, cheap first: (steps, restarts) on the largest row, then
# on the logsumexp (``all_rows_hold``); the first runs on every disjunct before any bound
STAGES = ((50, 2), SMOOTH_PGD)
# of the time left at an unrefuted disjunct, the joint search's probe, run first: the atom
# route's search is stopped where its bound is below the probe's at the same age, then
# the joint search runs again from its root with the time left (docs/certification.md)
PROBE_SHARE = 0.05


@dataclass
class InstanceResult:
    status: str  # sat / unsat / timeout / unknown
    seconds: float
    margin: float
    counterexample: str = ""
    note: str = ""
    how: str = ""  # the engine that answered (``complete``: milp or bab)


@dataclass
class Network:
    """An instance's network: onnxruntime on the file as shipped, and its bound graph."""

    reference: OnnxRuntimePredictor
    graph: BoundGraph
    normalises: InputRange | None  # the range its own normalisation takes, if it has one

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.reference.input_shape)

    def run(self, x: torch.Tensor) -> torch.Tensor:
        """onnxruntime's logits for inputs in the network's own space (replay)."""
        return self.reference.run_network(x.reshape(len(x), *self.reference.feed_shape))


@dataclass(frozen=True)
class _Bounded:
    """What ``verify_disjuncts`` uses of a network: its bound graph and the replay."""

    graph: BoundGraph
    run: Callable[[torch.Tensor], torch.Tensor]


@lru_cache(maxsize=4)
def load_network(path: str | Path) -> Network:
    """The network of an instance; cached, as a benchmark asks many properties of one net."""
    reference = _runtime(path)
    shape = reference.input_shape
    predictor = load_onnx(path, gradients=True, input_shape=shape)
    graph = build_graph(predictor.network.cpu(), shape, Path(path).name)
    return Network(reference, graph, graph_range(path, math.prod(shape)))


def verify_instance(
    registry: PluginRegistry,
    network: str | Path,
    spec: str | Path,
    verifier: str = "complete",
    timeout: float = 60.0,
    config: dict | None = None,
    declared: dict | None = None,
) -> InstanceResult:
    """Verify one instance with the named verifier under a time limit in seconds (and
    ``config``: other fields of the verifier's config, e.g. its clock). ``declared``: what
    the network is fed (``scale``, ``mean``, ``std``), to check the box against
    (``input_space.py``; without it, the graph's own normalisation if it has one).

    The limit covers the whole call, as VNN-COMP's does: the verifier gets what loading the
    network, its one-time ``prepare`` and reading the spec left of it (before #33's eighth
    session that setup, 1.3-1.6 s of CPU for the ``eran`` ReLU net here, ran outside it)."""
    began = time.perf_counter()
    clock = CLOCKS[(config or {}).get("clock", VerifierConfig.model_fields["clock"].default)]
    start = clock()
    _check_order(network, spec)
    net = load_network(str(network))
    n_inputs, shape = math.prod(net.shape), net.reference.graph_shape
    box, disjuncts = read_disjuncts(
        spec, n_inputs, net.reference.num_classes, f"network {Path(network).name!r}"
    )  # before any work: a property of another network is refused at once
    known = declared_range(shape, n_inputs, **(declared or {})) or net.normalises
    check_box(*box, known, Path(spec).name, shape)  # and a box of another input space
    check_centre_class(*box, disjuncts, net.run, Path(spec).name)
    settings = {**(config or {}), "timeout": timeout}
    checker = make_verifier(registry, verifier, settings)
    checker.check(net.graph)  # before any work
    checker.prepare()  # its one-time imports (alpha-CROWN's Adam: torch._dynamo), counted
    lower, upper = (b.reshape(1, *net.shape) for b in box)
    settings["timeout"] = timeout - (clock() - start)
    if settings["timeout"] <= 0:
        note = "timeout (loading the instance took the whole limit)"
        result = InstanceResult("timeout", 0.0, -math.inf, note=note)
    else:
        result = verify_disjuncts(registry, net, lower, upper, disjuncts, verifier, settings)
    engine = getattr(checker, "engine", None)
    result.how = engine(net.graph) if engine is not None else verifier
    result.seconds = time.perf_counter() - began
    return result


def _check_order(network: str | Path, spec: str | Path) -> None:
    """``aisafety verify SPEC.vnnlib NET.onnx`` (the VNN-COMP order is network first) would
    fail inside onnxruntime reading a text file as a protobuf."""
    if Path(network).suffix.lower() == ".vnnlib":
        raise VerificationError(
            f"{str(network)!r} is a VNN-LIB property, given where the ONNX network goes: the "
            f"network comes first (aisafety verify NET.onnx SPEC.vnnlib)"
            + (f": aisafety verify {spec} {network}" if Path(spec).suffix == ".onnx" else "")
        )


def verify_disjuncts(registry, net, lower, upper, disjuncts, verifier, settings):
    """The property "no disjunct holds on the box" for ``net`` (anything with the bound
    ``graph`` and the replay ``run`` of ``Network``): one verification of every row where
    each disjunct is one atom, else disjunct by disjunct (``_verify_conjunctions``); the
    verifier's ``settings`` include its time limit. Public for the fuzzing of this route
    (testkit/vnncomp_fuzz.py), which gives it networks that are not ONNX files.

    A graph of another dtype than float64 is bounded as its float64 copy, as ``verify``
    does (``Verifier.verify``: only float64 boxes and passes carry rounding margins); the
    box and rows widen to float64 exactly. Before, the conjunctions' first pass refused a
    float32 graph that one-atom disjuncts (through ``verify``) bounded (session 19)."""
    net = _Bounded(net.graph.in_dtype(torch.float64), net.run)
    if all(len(rows) == 1 for rows in disjuncts):
        rows = [r[0] for r in disjuncts]
        return _verify_rows(registry, net, lower, upper, rows, verifier, settings)
    return _verify_conjunctions(registry, net, lower, upper, disjuncts, verifier, settings)


def rows_property(lower: torch.Tensor, upper: torch.Tensor, rows: list[Row]) -> Property:
    """The box with one property row per VNN-LIB atom (``C y + d``, the atom holds where <= 0);
    public because benches build instances' properties the way ``verify_instance`` does."""
    spec = torch.stack([c for c, _ in rows]).unsqueeze(0)
    offset = torch.tensor([[d for _, d in rows]], dtype=torch.float64)
    return Property(lower, upper, spec, offset)


def _verify_rows(registry, net, lower, upper, rows, verifier, settings) -> InstanceResult:
    """Every row must stay positive (a disjunction of one-atom violations). A verifier that
    does not attack first (``crown``, ``ibp``, ...) gets the attack-first verifiers' box-PGD
    (``BoxPgd``) before its bounds, within the same limit (#33, session 21)."""
    prop = rows_property(lower, upper, rows)
    checker = make_verifier(registry, verifier, settings)
    if not checker.attack_first:  # an attack-first verifier's own ``verify`` attacks first
        deadline = checker.deadline(1)
        attacked = _attack(net, prop, deadline)
        if attacked is not None:
            return attacked
        left = {**settings, "timeout": max(deadline.left(), 1e-3)}
        checker = make_verifier(registry, verifier, left)  # the bounds get the rest
    result = checker.verify(net.graph, prop, net.run)
    verdict, note = result.verdicts[0], result.notes[0] if result.notes else ""
    margin = float(result.margins[0])
    if verdict is Verdict.CERTIFIED:  # its note: what the proof rests on, if not a bound
        return InstanceResult("unsat", 0.0, margin, note=note)
    if verdict is Verdict.FALSIFIED:
        return _sat(net, result.counterexamples[:1], margin)
    timed_out = verdict is Verdict.TIMEOUT or note == "timeout"
    return InstanceResult("timeout" if timed_out else "unknown", 0.0, margin, note=note)


class BoxPgd(Verifier):
    """The attack-first step of ``alpha-crown``, ``bab`` and ``complete`` (box-PGD from the
    box's centre, corners and random points, ``Verifier.attack_within`` with
    ``AttackFirstConfig``'s steps, restarts and share), for the one-atom route's verifiers
    that bound only: the same attack, not a second one. It attacks only; never registered."""

    name = "box-pgd"
    description = "the attack-first verifiers' box-PGD, alone"
    attack_first = True
    Config = AttackFirstConfig

    def lower_bounds(self, graph: BoundGraph, prop: Property):
        raise NotImplementedError("BoxPgd only attacks (attack_within); it bounds nothing")


def _attack(net: _Bounded, prop: Property, deadline) -> InstanceResult | None:
    """``sat`` at the point ``BoxPgd`` found (replayed through onnxruntime: in the box, an
    atom <= 0 there; its margin the lowest row there, float64), ``timeout`` where the attack
    met the deadline, else None: the bounds get the time left. Without it ``crown`` and
    ``ibp`` answered ``unknown`` on mnistfc 256x6 ``prop_1_0.05`` with 9.8 of 10 s unused,
    where ``alpha-crown`` finds ``sat`` in about 1 s (docs/certification.md)."""
    one = prop.to(net.graph.dtype)
    try:
        broken, point = BoxPgd().attack_within(net.graph, one, net.run, deadline)
    except OutOfTime:
        return InstanceResult("timeout", 0.0, -math.inf, note="timeout")
    if not bool(broken[0]):
        return None
    x, value = checked(net.run, one, point)
    return _sat(net, x, float(value[0]))


def _verify_conjunctions(registry, net, lower, upper, disjuncts, verifier, settings):
    """Each disjunct (a conjunction of atoms) refuted by one atom whose row is proved
    positive on the box, or by the joint search over its atoms (``_joint``), or satisfied
    at a replayed point (box-PGD on every disjunct first); one time limit for all.

    The margin is min over disjuncts of max over their atoms of the best lower bound proved
    for the atom: a lower bound of min_x min_d max_k row_k(x), positive only if ``unsat``;
    for ``sat``, that objective at the replayed point (<= 0), as a falsified sample's.
    Where the search stops at a disjunct, the disjuncts after it get their first pass if
    time is left (never past the deadline); a disjunct with no bound makes it -inf. An
    ``unsat`` keeps the notes of the atoms' certificates (``conjunction_note``)."""
    checker = make_verifier(registry, verifier, settings)
    deadline = checker.deadline(1)
    proved: list[float] = []  # per disjunct so far: the best bound proved for it
    notes: dict[tuple[int, int], str] = {}  # (disjunct, atom) -> its certificate's note
    for i, rows in enumerate(disjuncts):
        prop = rows_property(lower, upper, rows)
        try:
            with time_limit(deadline):
                point = _any_disjunct_holds(net, lower, upper, disjuncts) if i == 0 else None
                point = point if point is not None else all_rows_hold(net, prop, stages=(1,))
                if point is not None:
                    return _sat(net, point, value_at(net, lower, upper, disjuncts, point))
                bounds = _first_pass(checker, net, prop)
        except OutOfTime:
            return InstanceResult("timeout", 0.0, -math.inf, note="timeout")
        if float(bounds.max()) > 0:
            proved.append(float(bounds.max()))
            continue
        if not checker.complete:
            proved.append(float(bounds.max()))
            margin = _margin_so_far(
                checker, net, deadline, lower, upper, proved, disjuncts[i + 1 :]
            )
            return InstanceResult("unknown", 0.0, margin, note="bounds too loose")
        start = deadline.clock()
        probe = _joint(checker, net, prop, bounds, deadline.share(PROBE_SHARE))
        if probe.point is not None:
            return _sat(net, probe.point, value_at(net, lower, upper, disjuncts, probe.point))
        if not probe.why and probe.margin > 0:
            proved.append(probe.margin)
            continue
        rival = (deadline.clock() - start, probe.margin) if probe.ran else None
        refuted, best, point, why = _refuted_by_one_atom(
            registry, net, prop, bounds, verifier, settings, deadline, rival
        )
        best = max(best, probe.margin)
        joint = None
        if not refuted and point is None and not deadline.passed():
            joint = _joint(checker, net, prop, bounds, deadline)
            point, best = joint.point, max(best, joint.margin)
            refuted = joint.point is None and not joint.why and joint.margin > 0
        if point is not None:
            return _sat(net, point, value_at(net, lower, upper, disjuncts, point))
        proved.append(best)
        if why is not None:
            notes[(i, why[0])] = why[1]
        if not refuted:
            status = "timeout" if deadline.passed() else "unknown"
            margin = _margin_so_far(
                checker, net, deadline, lower, upper, proved, disjuncts[i + 1 :]
            )
            note = "a disjunct was not refuted"
            if joint is not None and joint.why:
                note += f" (joint search over its atoms: {joint.why})"
            return InstanceResult(status, 0.0, margin, note=note)
    return InstanceResult("unsat", 0.0, min(proved), note=conjunction_note(notes))


def _joint(checker, net: Network, prop: Property, first: torch.Tensor, deadline) -> JointOutcome:
    """Branch and bound over all the disjunct's atoms together (``conjunction_search.py``)
    from alpha-CROWN's root, with ``first`` (each atom's first-pass bound, offset
    included); without a ``bab``-family verifier or on a network with sigmoid or tanh,
    nothing more than ``first``."""
    graph = net.graph
    missing = _joint_missing(checker, graph)
    if missing:
        return JointOutcome(float(first.max()), None, f"not run: {missing}", ran=False)
    one = prop.to(graph.dtype)
    try:
        with time_limit(deadline), torch.no_grad():
            bound, _, boxes, _ = checker.bounds_and_boxes(graph, one)
    except OutOfTime:
        return JointOutcome(float(first.max()), None, "timeout")
    root = torch.maximum(first, added_down(bound, one.offset)[0].to(first.dtype))
    return ConjunctionSearch(checker.config, graph, one, boxes, net.run, deadline).run(root)


def _joint_missing(checker, graph) -> str | None:
    """What the joint search lacks here, or None: it is branch and bound over ReLU splits,
    so it needs a ``bab``-family verifier and a ReLU network (the text said "a ReLU network"
    for any verifier, also a complete plugin verifier on a ReLU network)."""
    if not isinstance(checker, BabVerifier):
        return (
            f"it is branch and bound's ('bab' or 'complete'), and verifier {checker.name!r} "
            "is not of that family"
        )
    if not graph.relu_only:
        return f"it needs a ReLU network (model {graph.model!r} has sigmoid or tanh)"
    return None


def conjunction_note(notes: dict[tuple[int, int], str]) -> str:
    """One note for the atoms whose certificates carry one: those resting on HiGHS's MIP
    bound named together (their one-row notes all say ``rows [0]``), any other as is."""
    on_mip = [f"disjunct {i} (atom {k})" for (i, k), note in notes.items() if MIP_NOTE in note]
    parts = [f"disjunct {i} (atom {k}): {note}" for (i, k), note in notes.items()
             if MIP_NOTE not in note]  # fmt: skip
    if on_mip:
        parts.insert(0, f"the atoms refuting {', '.join(on_mip)} {MIP_NOTE}")
    return "; ".join(parts)


def value_at(net: Network, lower, upper, disjuncts, x: torch.Tensor) -> float:
    """min over disjuncts of max over their atoms' rows at ``x``, replayed through
    onnxruntime: <= 0 where ``x`` satisfies a disjunct, an upper bound of the least value."""
    y = net.run(x).double()
    return min(float(rows_property(lower, upper, rows).rows(y).amax()) for rows in disjuncts)


def _first_pass(checker, net: Network, prop: Property) -> torch.Tensor:
    """Every atom's proved lower bound (offset included) from one bound pass; the graph and
    box checked float64 for any verifier (a plugin's ``lower_bounds`` need not check)."""
    prop = prop.to(net.graph.dtype)
    checker.require_float64(net.graph, prop, "verify_disjuncts()")
    with torch.no_grad(), checker.arithmetic():  # float32: rigorous, as ``verify``'s
        bounds, _ = checker.lower_bounds(net.graph, prop)
    return added_down(bounds, prop.offset)[0]


def _margin_so_far(checker, net, deadline, lower, upper, proved: list[float], rest) -> float:
    """min over disjuncts of their proved bounds, the ``rest`` (not searched) by their first
    pass within what is left of ``deadline``: -inf if one of them gets none."""
    try:
        for rows in rest:
            if deadline.passed():
                return -math.inf
            with time_limit(deadline):
                bounds = _first_pass(checker, net, rows_property(lower, upper, rows))
            proved = [*proved, float(bounds.max())]
    except OutOfTime:  # a pass cut off by the limit is never used
        return -math.inf
    return min(proved)


def _refuted_by_one_atom(registry, net, prop, bounds, verifier, settings, deadline, rival=None):
    """A complete verifier on each atom alone, the most promising (highest bound) first:
    (refuted, the disjunct's best proved bound, a replayed point where all its atoms hold,
    and (atom, note) where the refuting certificate has a note, else None).

    An atom's counterexample satisfies the disjunct when it is the disjunct's only atom (or
    all the others hold there too); a falsified atom's margin is its point's value, not a
    proved bound, so only its first-pass bound counts. A search that stops improving, or
    stands below ``rival`` (the joint search's probe: seconds, bound) at the same age
    (``stall.StallWatch``), ends the route: the joint search gets the time left."""
    best = bounds.clone()
    for k in bounds.argsort(descending=True).tolist():
        if deadline.passed():
            break
        left = {**settings, "timeout": max(deadline.left(), 1e-3)}
        checker = make_verifier(registry, verifier, left)
        with watching(StallWatch(deadline, rival)) as watch:
            result = checker.verify(net.graph, prop_row(prop, k), net.run)
        verdict = result.verdicts[0]
        if verdict is Verdict.FALSIFIED:
            point = result.counterexamples[:1]
            if _all_hold_at(net, prop, point):
                return False, float(best.max()), point, None
            continue
        best[k] = max(float(best[k]), float(result.margins[0]))
        if verdict is Verdict.CERTIFIED:
            note = result.notes[0] if result.notes else ""
            return True, float(best.max()), None, (k, note) if note else None
        if watch.stalled:  # the joint search gets the time left
            break
    return False, float(best.max()), None, None


def _any_disjunct_holds(net: Network, lower, upper, disjuncts) -> torch.Tensor | None:
    """The cheap stage of ``all_rows_hold`` on every disjunct before any bound work: a
    replayed point where some disjunct holds, or None. Attacked one at a time between the
    bound passes, a disjunct after one left open (``unknown``, or the search out of time)
    was never attacked: a violated property answered ``unknown`` or ``timeout``. Each
    disjunct's costly stage still runs just before its own bounds: all of them first, the
    attacks alone took the whole 3 s limit on a fuzz case (seed 131) that the bounds left
    ``unknown`` with the exact value as margin."""
    for rows in disjuncts:
        point = all_rows_hold(net, rows_property(lower, upper, rows), stages=(0,))
        if point is not None:
            return point
    return None


def prop_row(prop: Property, k: int) -> Property:
    """The one-row property of row ``k``."""
    return Property(prop.lower, prop.upper, prop.spec[:, k : k + 1], prop.offset[:, k : k + 1])


def all_rows_hold(net: Network, prop: Property, stages=(0, 1)) -> torch.Tensor | None:
    """A point of the box where every row is <= 0 (all atoms hold), replayed, or None.

    Box-PGD on the largest row first (cheap; its gradient reaches one row at a time), then
    on a smooth bound of it, ``logsumexp`` of the rows (at most log K above the largest,
    its gradient on every row), with more restarts: on cifar10_medium index2317 (eps 0.012)
    the largest row stopped at +0.20 at any restarts, where the smooth loss (as
    alpha-beta-CROWN's attack) finds the violation in about 2 s of CPU
    (docs/certification.md, session 15). ``stages``: which of the two (``STAGES``) run."""
    losses = max_row_losses(net.graph, prop)
    single = one_row(prop)
    for stage in stages:
        loss, (steps, restarts) = losses[stage], STAGES[stage]
        candidate = into_box(pgd_on_rows(loss, single, steps=steps, restarts=restarts), prop)
        if _all_hold_at(net, prop, candidate):
            return candidate
    return None


def _all_hold_at(net: Network, prop: Property, x: torch.Tensor) -> bool:
    """``x`` lies in the box and every row is <= 0 there, replayed through onnxruntime."""
    return bool(all_hold(net.run, prop, x).all())


def _sat(net: Network, x: torch.Tensor, margin: float) -> InstanceResult:
    y = net.run(x)[0]
    lines = [f"(X_{i} {v!r})" for i, v in enumerate(x.flatten().tolist())]
    lines += [f"(Y_{j} {v!r})" for j, v in enumerate(y.tolist())]
    return InstanceResult("sat", 0.0, margin, "(" + "\n ".join(lines) + ")")


def _runtime(network: str | Path) -> OnnxRuntimePredictor:
    """onnxruntime's predictor; a graph taking flat vectors gets a (1, 1, n) layout."""
    try:
        return OnnxRuntimePredictor(network)
    except ConfigError as refused:  # not (N, C, H, W), or no onnxruntime (this says so)
        from aisafety.prediction.onnx_model import import_optional

        ort = import_optional("onnxruntime", "onnxruntime")
        try:
            dims = ort.InferenceSession(str(network)).get_inputs()[0].shape
        except Exception:  # onnxruntime's own types: not a file it loads; the refusal says why
            raise refused from None
        size = math.prod(d for d in dims[1:] if isinstance(d, int) and d > 0)
        return OnnxRuntimePredictor(network, input_shape=(1, 1, size))


def verify_report(
    registry: PluginRegistry,
    network: str,
    spec: str,
    verifier: str,
    timeout: float,
    declared: dict | None = None,
) -> str:
    """What ``aisafety verify`` prints: the status (and counterexample) as VNN-COMP, then a
    comment line with the time and the margin bound, and one with the result's note if it
    has one (why it is open; for ``unsat``, the rows that rest on HiGHS's MIP bound)."""
    result = verify_instance(registry, network, spec, verifier, timeout, declared=declared)
    lines = [result.status]
    if result.counterexample:
        lines.append(result.counterexample)
    engine = f" ({result.how})" if result.how != verifier else ""
    lines.append(f"# {verifier}{engine}: {result.seconds:.2f} s, margin bound {result.margin:.4g}")
    if result.note:
        lines.append(f"# note: {result.note}")
    return "\n".join(lines)
