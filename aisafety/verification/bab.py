"""Branch and bound on beta-CROWN bounds (``split_bounds.py``): the ``bab`` verifier.

Per sample: box-PGD first (``base.py``), then CROWN and alpha-CROWN on every row; the rows
still <= 0 get ``root_steps`` more Adam steps on their output slopes (alpha-CROWN's 20 are
far from converged on deeper nets), and each row still <= 0 becomes a domain starting from
those slopes. Each round takes the ``domain_batch`` open domains with the
lowest bounds (best first: the ones that decide the verdict), splits each in two and
bounds all children in one batch (alpha and beta optimised per domain). A child whose
bound is > 0 is pruned (proved); the corner minimising each child's linear bound is
replayed through the predictor, and every ``attack_every`` rounds box-PGD starts from the
corners of the most promising domains. A row is proved when no domain of it is left; the
sample is falsified at the first replayed counterexample.

Branching: on a ReLU network, the unstable neuron with the largest BaBSR-style score
(Bunel et al. 2020): the bias the relaxation loses there, ``max(-A, 0) * (-l u / (u - l))``
with ``A`` the coefficient reaching the ReLU's output, ties broken by ``|A|`` times the
same intercept. ``branching: fsb`` (filtered smart branching, De Palma et al. 2021) bounds
the two children of each domain's ``fsb_candidates`` best BaBSR candidates by one cheap
beta-CROWN pass (no optimisation) and splits the one whose worse child is highest. On a
network with at most ``input_split_max`` inputs the input box is split instead, at the
middle of the dimension with the largest ``|coefficient| * width``.

On a network with sigmoid or tanh activations, after the root: rounds of alpha-CROWN on
every bound, then branch and bound over those neurons, each split cutting one neuron's
input interval in two (``sshape_search.py``, ``sshape_split.py``).

Intermediate bounds: by default every domain is bounded on the root's intermediate boxes
with its split neurons cut; ``intermediate_bounds: true`` re-bounds by CROWN, per domain,
the input of every ReLU layer after the domain's first split (``split_bounds.py``).
Both options are off by default: measured on mnistfc 256x2 they cost more CPU than they
save (docs/certification.md).

Anytime: out of time, each row's bound is the lowest over its open and proved domains,
which is a sound lower bound of the row on the whole box; the clock is read between rounds
and inside every bound pass (``check_time``), so one round's cost is all it can overrun.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import Field

from aisafety.memory_budget import current_budget
from aisafety.verification import budget
from aisafety.verification.bounds import (
    CROWN_KINDS,
    search_slopes,
    sound_backward,
)
from aisafety.verification.deadline import Deadline, OutOfTime, current_deadline, time_limit
from aisafety.verification.falsify import Model, pgd_on_rows, replay
from aisafety.verification.float64_margin import added_down
from aisafety.verification.graph import BoundGraph
from aisafety.verification.incomplete import AlphaCrownConfig, AlphaCrownVerifier
from aisafety.verification.ops import Box
from aisafety.verification.property import Property
from aisafety.verification.split_bounds import (
    Domains,
    bound_domains,
    cheap_bounds,
    domain_boxes,
    empty_domains,
    relu_nodes,
    root_domains,
)
from aisafety.verification.sshape_search import SShapeSearch
from aisafety.verification.stall import report, watched

# the root's slope search may take this share of a sample's time; cut short, the search
# starts from CROWN's slopes with the rest
ROOT_SHARE = 0.25
# Adam steps per round by default: 20 on fully connected nets (10 stalled on mnistfc 256x4,
# #33's fourth session); on the CIFAR ResNet resnet_2b the bounds after each round were the
# same to 1e-4 with 10 as with 20, at 57% of the CPU (docs/certification.md, sixth session)
DENSE_BAB_STEPS, CONV_BAB_STEPS = 20, 10


class BabConfig(AlphaCrownConfig):
    batch_size: int = Field(default=1, gt=0, description="samples bounded together at the root")
    domain_batch: int = Field(default=64, gt=0, description="domains split per round")
    bab_steps: int | None = Field(
        default=None,
        ge=0,
        description="Adam steps on alpha and beta per round (None: 20 on fully connected "
        "networks, CONV_BAB_STEPS on networks with a convolution)",
    )
    bab_lr: float = Field(default=0.03, gt=0, description="Adam learning rate of beta")
    bab_lr_alpha: float | None = Field(
        default=None, gt=0, description="Adam learning rate of alpha (None: bab_lr)"
    )
    input_split_max: int = Field(
        default=8, ge=0, description="split the input box of nets with at most this many inputs"
    )
    max_domains: int = Field(default=100_000, gt=0, description="open domains kept at most")
    max_memory_mb: float = Field(
        default=2048, gt=0, description="open domains' slopes, multipliers and splits at most"
    )
    attack_every: int = Field(
        default=10, ge=0, description="rounds between box-PGD runs on the best domains (0: never)"
    )
    branching: Literal["babsr", "fsb"] = Field(
        default="babsr",
        description="ReLU to split: the best BaBSR score ('babsr'), or of the fsb_candidates "
        "best by BaBSR the one whose worse child a cheap beta-CROWN pass bounds highest ('fsb')",
    )
    fsb_candidates: int = Field(
        default=3, gt=0, description="candidates FSB bounds per domain and score (two scores)"
    )
    fsb_reduce: Literal["min", "max"] = Field(
        default="min",
        description="FSB ranks a candidate by its worse child's cheap bound ('min') or its "
        "better child's ('max', alpha-beta-CROWN's mnistfc setting)",
    )
    root_steps: int = Field(
        default=100, ge=0, description="Adam steps on the open rows' output slopes at the root"
    )
    stall_steps: int = Field(
        default=80,
        ge=0,
        description="more Adam steps, resumed, for children no higher than their parent",
    )
    root_lr: float = Field(default=0.1, gt=0, description="Adam learning rate at the root")
    root_decay: float = Field(
        default=0.98, gt=0, le=1, description="the root's learning rate times this per step"
    )
    intermediate_bounds: bool = Field(
        default=False,
        description="bound each domain's ReLU layers after its first split again by CROWN "
        "(tighter and slower per domain); false: the root's, only split neurons cut",
    )


@dataclass
class Outcome:
    """One sample's search: a sound lower bound per row, a replayed counterexample or None,
    and why it stopped short (``timeout``, ``not split further``, ``domain limit``) or ''."""

    bounds: torch.Tensor
    point: torch.Tensor | None
    why: str


class BabVerifier(AlphaCrownVerifier):
    name = "bab"
    description = (
        "branch and bound: box-PGD first, alpha-CROWN, then ReLU (or input) splits bounded by "
        "beta-CROWN in batches, best first; settles every ReLU network's sample given time; "
        "sigmoid/tanh: rounds of alpha-CROWN, then splits of their neurons' input intervals"
    )
    complete = True
    attack_first = True
    Config = BabConfig
    # max-pooling is relaxed (ops.MaxPool, DeepPoly's lines), never split; the complete
    # verifier's MILP encodes it exactly (milp_maxpool.py)
    kinds = CROWN_KINDS

    def verify(self, graph: BoundGraph, prop: Property, model: Model | None = None):
        self._model = model or (lambda x: graph.forward(x.to(graph.dtype)))
        return super().verify(graph, prop, self._model)

    def noted_bounds(self, graph: BoundGraph, prop: Property):
        """alpha-CROWN's root, then a search on each open sample: its bound, its
        coefficients and per sample why the search left it open (the root's note if none)."""
        self._found: dict[int, torch.Tensor] = {}  # this batch's, even if it runs out of time
        # checks the dtypes first (direct calls), records each bound
        bounds, coeff, boxes, note = self.bounds_and_boxes(graph, prop)
        why = [f"bounds too loose ({note})" if note else ""] * len(prop)
        # ``verify`` runs this inside the batch's limit; called directly (the registry-wide
        # contract does), the batch gets the verifier's own limit per sample
        batch = current_deadline() or self.deadline(len(prop))
        bounds = bounds.clone()
        for s in range(len(prop)):
            if (bounds[s] + prop.offset[s]).min() > 0:
                continue
            deadline = batch.share(1 / (len(prop) - s), at_most=self.config.timeout)
            sample_boxes = [(lo[s : s + 1], hi[s : s + 1]) for lo, hi in boxes]
            outcome = self.search(graph, prop[s : s + 1], sample_boxes, bounds[s], deadline)
            # stored less the offset, rounded down: to nearest, it could be an ulp above
            # the proved margin once ``verify`` adds the offset back
            bounds[s] = torch.maximum(bounds[s], added_down(outcome.bounds, -prop.offset[s]))
            self.record(bounds, coeff)
            if outcome.point is not None:
                self._found[s] = outcome.point
            why[s] = outcome.why or why[s]
        return bounds, coeff, why

    def _candidates(self, prop: Property, bounds: torch.Tensor, coeff: torch.Tensor | None):
        yield from super()._candidates(prop, bounds, coeff)
        found = getattr(self, "_found", {})
        if found:
            points = (prop.lower + prop.upper) / 2
            for s, point in found.items():
                points[s] = point.to(points.dtype)
            yield points

    def search(
        self, graph: BoundGraph, prop: Property, boxes: list[Box], bound, deadline: Deadline
    ) -> Outcome:
        """Branch and bound on the rows of ``prop`` (one sample) whose ``bound`` is <= 0."""
        # the predictor ``verify`` was given replays candidates; called directly, the graph
        model = getattr(self, "_model", None) or (lambda x: graph.forward(x.to(graph.dtype)))
        return Search(self.config, graph, prop, boxes, model, deadline).run(
            added_down(bound, prop.offset[0]).detach()  # kept as proved where > 0
        )


DOMAIN_SHARE = 0.5  # of the enclosing budget; the rest is the domain batches' bound passes


def domain_memory(max_memory_mb: float, device: torch.device | str = "cpu") -> int:
    """Bytes the open domains may take: ``max_memory_mb``, at most ``DOMAIN_SHARE`` of the
    enclosing memory budget (inside ``verify``, the budget less what the call holds), so a
    plan's ``limits.memory_gib`` below 4 GiB also bounds the domain store."""
    return int(min(max_memory_mb * 2**20, DOMAIN_SHARE * current_budget(device)))


class Search:
    """The state of one sample's branch and bound (see the module docstring)."""

    def __init__(self, config, graph, prop, boxes, model, deadline, on_prune=None):
        self.config, self.graph, self.prop, self.root = config, graph, prop, boxes
        self.model, self.deadline, self.on_prune = model, deadline, on_prune
        self.input_split = prop.lower[0].numel() <= config.input_split_max
        self.relus = relu_nodes(graph)
        self.rounds = 0
        self.steps = round_steps(config, graph)

    def run(self, root_bound: torch.Tensor) -> Outcome:
        k = len(root_bound)
        self.proved = torch.full((k,), torch.inf, dtype=root_bound.dtype)
        self.proved[root_bound > 0] = root_bound[root_bound > 0]
        rows = torch.nonzero(root_bound <= 0).flatten()
        if len(rows) == 0:
            return Outcome(self.proved, None, "")
        spec, offset = self.prop.spec[0, rows], self.prop.offset[0, rows]
        found = self._root_in_share(spec, offset)
        if found is None:  # the search gets the rest, from CROWN's slopes
            if self.deadline.passed():
                return self._outcome_at_root(root_bound)
            found = torch.full_like(offset, -torch.inf), {}
        bound, slopes = found
        root_bound = root_bound.clone()
        root_bound[rows] = torch.maximum(root_bound[rows], bound.to(root_bound.dtype))
        self.proved[root_bound > 0] = root_bound[root_bound > 0]
        keep = root_bound[rows] <= 0
        if not keep.any():
            return Outcome(self.proved, None, "")
        rows, spec, offset = rows[keep], spec[keep], offset[keep]
        slopes = {i: t[keep] for i, t in slopes.items()}
        if not self.graph.relu_only:  # sigmoid or tanh: their own domains and splits
            return self._sshape(root_bound, rows, spec, offset)
        todo = root_domains(self.graph, self.root, spec, offset, rows, slopes)
        todo.bound = root_bound[rows].clone()
        per_domain = sum(t[0].numel() * t.element_size() for part in
                         (todo.alpha, todo.beta, todo.splits) for t in part.values())  # fmt: skip
        memory = domain_memory(self.config.max_memory_mb, self.prop.lower.device)
        self.max_open = max(1, min(self.config.max_domains, int(memory / max(1, per_domain))))
        self.open: Domains | None = None
        self.stuck: list[torch.Tensor] = []  # bounds of domains that cannot be split
        try:
            point = self._rounds(todo)
        except OutOfTime:
            return self._outcome("timeout")
        return Outcome(root_bound, point, "") if point is not None else self._outcome("")

    def _rounds(self, todo: Domains) -> torch.Tensor | None:
        """Rounds from ``todo`` until a replayed counterexample (returned) or none left to
        split (None). Out of time, the domains being bounded join the open ones (their
        parents' bounds stand) and ``OutOfTime`` propagates."""
        try:
            with time_limit(self.deadline):
                while todo is not None:
                    self._inflight = todo
                    point = self._bound_and_prune(todo)
                    self._inflight = None
                    every = self.config.attack_every
                    if point is None and every and self.rounds % every == every - 1:
                        point = self._attack()
                    if point is not None:
                        return point
                    if watched():  # a caller hands the time on once this stops rising
                        report(self._lowest())
                    todo = self._next_round()
        except OutOfTime:
            if self._inflight is not None:
                self.open = Domains.cat([d for d in (self.open, self._inflight) if d is not None])
            raise
        return None

    def _lowest(self) -> float:
        """The least bound over proved and open domains (``stall.report``'s measure)."""
        low = float(self.proved.min())
        if self.open is not None and len(self.open):
            low = min(low, float(self.open.bound.min()))
        return low

    def _attack(self) -> torch.Tensor | None:
        """Box-PGD from the most promising open domains (``_attack_from``), if any."""
        if self.open is None or not len(self.open):
            return None
        return self._attack_from(self.open.take(torch.argsort(self.open.bound)))

    def _root_in_share(self, spec: torch.Tensor, offset: torch.Tensor):
        """``_root`` within ``ROOT_SHARE`` of the time left, or None where cut short."""
        try:
            with time_limit(self.deadline.share(ROOT_SHARE)):
                return self._root(spec, offset)
        except OutOfTime:
            return None

    def _root(self, spec: torch.Tensor, offset: torch.Tensor):
        """The open rows' bounds (K,) by alpha-CROWN with ``root_steps`` of Adam on their
        output slopes (``root_lr``, decayed by ``root_decay`` per step), and those slopes
        per ReLU (K, *shape): the root domains start from them."""
        graph, config = self.graph, self.config
        a = spec.reshape(1, len(offset), *graph.ops[-1].out_shape).to(graph.dtype)
        end = len(graph.ops) - 1
        per_row = budget.row_bytes(graph, end, 1, grad=True)
        step = budget.rows_per_chunk(per_row, len(offset), budget.box_bytes(graph, 1))
        bounds, parts = [], []
        for first in range(0, len(offset), step):  # rows are independent: chunks for memory
            rows = a[:, first : first + step]
            chosen = search_slopes(graph, end, rows, self.root, config.root_steps,
                                   config.root_lr, config.root_decay)  # fmt: skip
            if not chosen:
                return torch.full_like(offset, -torch.inf), {}
            slopes = {i: t.to(graph.dtype) for i, t in chosen.items()}
            with torch.no_grad():
                whole = len(offset)  # the precision of all rows, whatever the chunk
                bound = sound_backward(graph, end, rows, self.root, slopes=slopes, rows=whole)
                bounds.append(bound[0][0])
            parts.append(chosen)
        slopes = {i: torch.cat([p[i][0] for p in parts]) for i in parts[0]}
        return added_down(torch.cat(bounds), offset), slopes

    def _sshape(self, root_bound, rows, spec, offset) -> Outcome:
        """A network with sigmoid or tanh activations: ``sshape_search.py``'s search."""
        memory = domain_memory(self.config.max_memory_mb, self.prop.lower.device)
        search = SShapeSearch(self.config, self.graph, self.prop, self.root, self.model,
                              self.deadline, self.proved, memory, self.steps)  # fmt: skip
        return Outcome(*search.run(root_bound, rows, spec, offset))

    def _outcome_at_root(self, root_bound: torch.Tensor) -> Outcome:
        """Out of time before the root's slopes: the bound it was given stands."""
        bounds = torch.minimum(self.proved, root_bound)
        return Outcome(bounds, None, "timeout")

    def _outcome(self, why: str) -> Outcome:
        bounds = self.proved.clone()
        parts = [self.open] if self.open is not None and len(self.open) else []
        for d in parts:
            bounds.scatter_reduce_(0, d.row, d.bound.to(bounds.dtype), "amin")
        if self.stuck:
            stuck = torch.cat(self.stuck)
            bounds.scatter_reduce_(0, stuck[:, 0].long(), stuck[:, 1], "amin")
            why = why or "not split further"
        if not why and (bounds <= 0).any():
            why = "domain limit"
        return Outcome(bounds, None, why)

    _parents: Domains | None = None
    _inflight: Domains | None = None

    def _bound_and_prune(self, todo: Domains) -> torch.Tensor | None:
        """Bound ``todo`` (children of ``_parents``), prune the proved, keep the rest."""
        done, coeff, at_relu, boxes = self._bound(todo)
        point = self._corners(done, coeff)
        if point is not None:
            return point
        proved = self._pruned(done)
        if proved.any():
            self._prove(done.take(torch.nonzero(proved).flatten()))
        keep = torch.nonzero(~proved).flatten()
        rest = done.take(keep)
        rest.branch = self._choose(rest, coeff[keep], {i: a[keep] for i, a in at_relu.items()},
                                   [(lo[keep], hi[keep]) for lo, hi in boxes])  # fmt: skip
        splittable = rest.branch[:, 0] >= 0
        if (~splittable).any():
            stuck = rest.take(torch.nonzero(~splittable).flatten())
            self.stuck.append(torch.stack([stuck.row.double(), stuck.bound.double()], 1))
        rest = rest.take(torch.nonzero(splittable).flatten())
        self.open = Domains.cat([d for d in (self.open, rest) if d is not None and len(d)]) \
            if (self.open is not None and len(self.open)) or len(rest) else None  # fmt: skip
        self._parents = None
        return None

    def _pruned(self, done: Domains) -> torch.Tensor:
        """(D,) True where the domain is proved: its row's bound is > 0 there."""
        return done.bound > 0

    def _prove(self, leaves: Domains) -> None:
        """Record the pruned domains' bounds (their rows' proved bounds are the least)."""
        self.proved.scatter_reduce_(0, leaves.row, leaves.bound.to(self.proved.dtype), "amin")
        if self.on_prune is not None:
            self.on_prune(leaves)

    def _bound(self, todo: Domains):
        """``todo`` bounded (alpha, beta optimised; an empty domain's bound +inf; a child
        never below its parent), its input coefficients, the coefficients reaching each
        ReLU and its boxes."""
        config = self.config
        steps = self.steps if self.rounds else max(self.steps, config.steps)
        done, coeff, at_relu, boxes = bound_domains(self.graph, self.root, todo, steps,
                                                    config.bab_lr, self.input_split,
                                                    config.intermediate_bounds,
                                                    config.bab_lr_alpha, True)  # fmt: skip
        empty = empty_domains(boxes)  # no point satisfies its splits: pruned, vacuously
        if self._parents is not None:  # a child is at least as tight as its parent
            parent = self._parents.bound.repeat(2)
            if not config.intermediate_bounds:  # (with them, ``boxes`` are these already)
                stalled = done.bound <= parent + 1e-6 * (1 + parent.abs())
                empty |= self._empty_when_stalled(done, stalled & ~empty)
                self._reoptimise(done, coeff, at_relu, stalled & ~empty)
            done.bound = torch.maximum(done.bound, parent)
        done.bound = torch.where(empty, torch.full_like(done.bound, torch.inf), done.bound)
        return done, coeff, at_relu, boxes

    def _empty_when_stalled(self, done: Domains, stalled: torch.Tensor) -> torch.Tensor:
        """Children no higher than their parent, checked for emptiness on per-domain
        intermediate boxes (CROWN after their splits; ``domain_boxes``): a split that moves
        nothing often means splits that contradict each other, which the root's boxes cut
        by IBP do not show (e.g. a whole ReLU layer switched off: a constant bound)."""
        empty = torch.zeros(len(done), dtype=torch.bool)
        picked = torch.nonzero(stalled).flatten()
        if len(picked):
            own = domain_boxes(self.graph, self.root, done.take(picked), self.input_split, True)
            empty[picked] = empty_domains(own)
        return empty

    def _reoptimise(self, done: Domains, coeff, at_relu, picked: torch.Tensor) -> None:
        """``stall_steps`` more Adam steps, resumed from the last ones' alpha and beta, for
        the children that did not rise above their parent; the bound kept where higher, the
        last alpha and beta kept to resume from. Measured on mnistfc 256x4 prop_5_0.03:
        such domains' multipliers grow by about lr per step towards the ones that prove
        their splits contradictory; of 100 stalled domains, 20 steps proved 9, 60 proved
        57 and 100 proved 99 (docs/certification.md)."""
        picked = torch.nonzero(picked).flatten()
        if not len(picked) or not self.config.stall_steps:
            return
        sub = done.take(picked)
        config = self.config
        again, more, reach, _ = bound_domains(self.graph, self.root, sub, config.stall_steps,
                                              config.bab_lr, self.input_split, False,
                                              config.bab_lr_alpha, True)  # fmt: skip
        for i in done.alpha:
            done.alpha[i][picked] = again.alpha[i].to(done.alpha[i].dtype)
            done.beta[i][picked] = again.beta[i].to(done.beta[i].dtype)
        better = again.bound > sub.bound
        at = picked[better]
        done.bound[at] = again.bound[better]
        coeff[at] = more[better]
        for i in at_relu:
            at_relu[i][at] = reach[i][better].to(at_relu[i].dtype)

    def _next_round(self) -> Domains | None:
        """The children of the lowest-bound open domains, or None when none is left."""
        if self.open is None or not len(self.open) or len(self.open) > self.max_open:
            return None
        self.rounds += 1
        order = self._best_first(self.open)
        n = min(self._round_size(), len(order))
        picked, rest = self.open.take(order[:n]), self.open.take(order[n:])
        self.open = rest if len(rest) else None
        self._parents = picked
        return _split(picked, self.input_split)

    def _best_first(self, open_: Domains) -> torch.Tensor:
        """The open domains' indices, the one to split first first: the lowest bound."""
        return torch.argsort(open_.bound)

    def _round_size(self) -> int:
        """Domains split per round."""
        return self.config.domain_batch

    def _corners(self, done: Domains, coeff: torch.Tensor) -> torch.Tensor | None:
        """The corner minimising each domain's linear bound, replayed: the first violation."""
        corner = torch.where(coeff[:, 0] > 0, done.lower, done.upper)
        prop = self.prop.expand(len(done))
        hit = replay(self.model, prop, corner)
        return corner[hit][0] if hit.any() else None

    def _attack_from(self, picked: Domains) -> torch.Tensor | None:
        """Box-PGD on the whole box from the centres of the most promising domains."""
        best = picked.take(torch.arange(min(4, len(picked))))
        prop = self.prop.expand(len(best))
        start = (best.lower + best.upper) / 2
        forward = lambda x: self.graph.forward(x.to(self.graph.dtype))  # noqa: E731
        point = pgd_on_rows(forward, prop, max(1, self.config.attack_steps // 2), 0, start=start)
        hit = replay(self.model, prop, point)
        return point[hit][0] if hit.any() else None

    def _choose(self, d: Domains, coeff, at_relu, boxes) -> torch.Tensor:
        """Per domain (node, index) to split on; node -1 where nothing is left to split."""
        if self.input_split:
            width = (d.upper - d.lower).flatten(1)
            score = coeff[:, 0].flatten(1).abs() * width + 1e-9 * width
            best = score.argmax(1)
            node = torch.where(width.gather(1, best[:, None])[:, 0] > 0, 0, -1)
            return torch.stack([node, best], 1)
        fsb = self.config.branching == "fsb"
        flat, bias_score, owner, start = self._babsr(d, at_relu, boxes, fsb)
        pick = flat.argmax(1)
        if fsb and len(d) and flat.shape[1] > 1:
            pick = self._fsb(d, boxes, [flat, bias_score], owner, start)
        node = torch.where(flat.gather(1, pick[:, None])[:, 0] > 0, owner[pick], -1)
        layer = torch.searchsorted(start[1:], pick, right=True)
        return torch.stack([node, pick - start[layer]], 1)

    def _babsr(self, d: Domains, at_relu, boxes, with_bias_score: bool):
        """Two branching scores (D, all ReLUs), -1 where stable or split: the intercept the
        relaxation loses, ``max(-A, 0) * (-l u / (u - l))`` (ties by ``|A|``), and BaBSR's
        (Bunel et al. 2020, as alpha-beta-CROWN computes it) with the pre-activation bias
        ``b``: ``|max(b A (s - 1), b A s) + min(A, 0) (-l s)|``, ``s = u / (u - l)``, only
        ``with_bias_score`` (FSB's second ranking; else None); each column's node; node
        offsets."""
        scores, with_bias, owners = [], [], []
        for i in self.relus:
            j = self.graph.ops[i].inputs[0]
            lo, hi = (t.flatten(1) for t in boxes[j])
            a = at_relu[i].flatten(1).to(lo.dtype)
            unstable = (lo < 0) & (hi > 0)
            slope = hi / (hi - lo).clamp(min=1e-12)
            intercept = -lo * slope
            score = (-a).clamp(min=0) * intercept + 1e-3 * a.abs() * intercept + 1e-9 * intercept
            scores.append(torch.where(unstable, score + 1e-12, torch.full_like(score, -1.0)))
            if with_bias_score:
                ba = _pre_activation_bias(self.graph.ops[j], lo.shape[1]).to(lo.dtype) * a
                bias = (
                    torch.maximum(ba * (slope - 1), ba * slope) + a.clamp(max=0) * intercept
                ).abs()
                with_bias.append(torch.where(unstable, bias + 1e-12, torch.full_like(bias, -1.0)))
            owners.append(torch.full((lo.shape[1],), i))
        start = torch.cumsum(torch.tensor([0] + [s.shape[1] for s in scores]), 0)
        bias_scores = torch.cat(with_bias, 1) if with_bias_score else None
        return torch.cat(scores, 1), bias_scores, torch.cat(owners), start

    def _fsb(self, d: Domains, boxes, scores, owner, start) -> torch.Tensor:
        """Filtered smart branching (De Palma et al. 2021; alpha-beta-CROWN's ``kfsb``): of
        each domain's ``fsb_candidates`` best by each of ``scores``, the one whose children
        a cheap beta-CROWN pass bounds best (``fsb_reduce``: the worse child, or the
        better)."""
        n = len(d)
        k = min(self.config.fsb_candidates, scores[0].shape[1])
        top = [s.topk(k, dim=1) for s in scores]  # (D, k) each, best first
        score = torch.cat([t.values for t in top], 1)
        cand = torch.cat([t.indices for t in top], 1)
        k = cand.shape[1]
        kids = Domains.cat([d] * (2 * k))  # block 2c + side: candidate c, side + or -
        layer = torch.searchsorted(start[1:], cand, right=True)
        node, idx = owner[cand], cand - start[layer]
        rows = torch.arange(n)
        for c in range(k):
            for side, sign in ((0, 1), (1, -1)):
                at = (2 * c + side) * n + rows
                for i, splits in kids.splits.items():  # fresh tensors (``cat``)
                    mine = node[:, c] == i
                    splits[at[mine], idx[mine, c]] = sign
        repeated = [(lo.repeat(2 * k, *[1] * (lo.dim() - 1)),
                     hi.repeat(2 * k, *[1] * (hi.dim() - 1))) for lo, hi in boxes]  # fmt: skip
        bound = cheap_bounds(self.graph, repeated, kids).reshape(k, 2, n)
        reduced = bound.amin(1) if self.config.fsb_reduce == "min" else bound.amax(1)
        reduced = torch.where(score > 0, reduced.T, torch.full_like(reduced.T, -torch.inf))
        return cand.gather(1, reduced.argmax(1, keepdim=True))[:, 0]


def round_steps(config: BabConfig, graph: BoundGraph) -> int:
    """Adam steps per round: ``bab_steps``, or by default fewer on a convolutional network,
    whose rounds measured no tighter with more (``CONV_BAB_STEPS``)."""
    if config.bab_steps is not None:
        return config.bab_steps
    conv = any(op.kind == "conv" for op in graph.ops)
    return CONV_BAB_STEPS if conv else DENSE_BAB_STEPS


def _pre_activation_bias(op, n: int) -> torch.Tensor:
    """The constant term per neuron (n,) of the op feeding a ReLU (BaBSR's ``b``); zero
    for ops without one."""
    shape = tuple(op.out_shape)
    if op.kind == "dense" and op.bias is not None:
        return op.bias.reshape(n)
    if op.kind == "conv" and op.bias is not None:
        return op.bias.reshape(-1, *[1] * (len(shape) - 1)).expand(shape).reshape(n)
    if op.kind == "elementwise":
        return (op.shift * torch.ones(shape, dtype=op.shift.dtype)).reshape(n)
    return torch.zeros(n)


def _split(d: Domains, input_split: bool) -> Domains:
    """Two children per domain (first all the ``+`` halves, then all the ``-`` halves)."""
    n = len(d)
    children = Domains.cat([d, d])
    node, idx = d.branch[:, 0], d.branch[:, 1]
    rows = torch.arange(n)
    if input_split:
        lower, upper = children.lower.flatten(1).clone(), children.upper.flatten(1).clone()
        mid = (lower[rows, idx] + upper[rows, idx]) / 2
        lower[rows, idx] = mid
        upper[n + rows, idx] = mid
        children.lower = lower.reshape(children.lower.shape)
        children.upper = upper.reshape(children.upper.shape)
        return children
    for i in children.splits:
        mine = torch.nonzero(node == i).flatten()
        splits = children.splits[i].clone()
        splits[mine, idx[mine]] = 1
        splits[n + mine, idx[mine]] = -1
        children.splits[i] = splits
    return children
