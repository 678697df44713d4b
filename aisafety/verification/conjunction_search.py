"""Branch and bound over a conjunction of atoms: min_x max_k row_k on the box (#33).

A VNN-LIB disjunct with K atoms (Marabou's targeted properties: ``Y_t >= Y_j`` for every
j) holds at x when every row_k(x) <= 0, so it is refuted on the box when
min_x max_k row_k(x) > 0. One atom proved positive on the whole box refutes it
(``vnncomp``'s first route); where each atom alone is falsifiable, no atom does, and the
refutation has to combine atoms region by region. This search splits the box as ``bab``
does (ReLU splits; the input box on a network with few inputs) and bounds every atom on
every domain by beta-CROWN (``split_bounds.bound_domains``: each atom its own alpha and
beta). A domain is pruned when ANY atom's sound lower bound on it is > 0: no point of the
domain satisfies that atom, so none satisfies the conjunction. The bounds are the ones
``bab`` prunes with (rounding-safe, docs/certification.md); taking their maximum adds no
arithmetic.

Storage: ``bab``'s ``Domains``, K entries per domain (one per atom, same splits and
input box), group-contiguous: entry g K + k is atom k of domain g, so ``bab``'s
splitting, which keeps the order of its parents, keeps the groups. A domain's objective
is the max over its atoms' bounds (a lower bound of max_k row_k on it); the lowest is
split first, on the neuron (or input) that its atom with the highest bound, the one
closest to pruning the domain, chooses by ``bab``'s heuristic.

Attack: the corner minimising each atom's linear bound is replayed (a point where every
atom holds is a counterexample), and every ``attack_every`` rounds box-PGD on the largest
row, then on its logsumexp, starts from the leading atoms' corners of the lowest domains.

Anytime: the least objective over open, unsplittable and pruned domains is a lower bound
of min_x max_k row_k (the domains cover the box; an empty one holds no point); the search
proves the conjunction never holds only when no domain is left open.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from aisafety.verification.bab import Search, domain_memory
from aisafety.verification.deadline import OutOfTime
from aisafety.verification.falsify import Model, into_box, pgd_on_rows
from aisafety.verification.graph import BoundGraph
from aisafety.verification.property import Property
from aisafety.verification.split_bounds import Domains, root_domains

ATTACK_STARTS = 4  # domains whose leading corners box-PGD starts from


@dataclass
class JointOutcome:
    """A sound lower bound of min_x max_k row_k on the box, a replayed point where every
    atom holds (or None), and why the search stopped short ('' when every domain was
    pruned, then the bound is > 0; ``timeout``, ``not split further``, ``domain limit``).
    ``ran`` is False where no joint search applies (``vnncomp``: no ``bab``-family verifier,
    or sigmoid/tanh): the margin is then the atoms' first-pass bound, no rival route."""

    margin: float
    point: torch.Tensor | None
    why: str
    ran: bool = True


def all_hold(model: Model, prop: Property, x: torch.Tensor) -> torch.Tensor:
    """(n,) True where ``x`` (as given: ``falsify.into_box`` moves a candidate into the
    box first) lies in the box and every row is <= 0 there (the property before any
    narrowing), replayed through ``model``."""
    prop = prop.original
    with torch.no_grad():
        rows = prop.rows(model(x).to(torch.float64))
    return prop.inside(x) & (rows <= 0).all(1)


def max_row_losses(graph: BoundGraph, prop: Property) -> list[Callable]:
    """Box-PGD's losses for a point where every row is <= 0: the largest row (cheap; its
    gradient reaches one row at a time) and its smooth bound ``logsumexp`` (at most log K
    above, its gradient on every row), each as a one-row model (n, 1)."""

    def rows_at(x: torch.Tensor) -> torch.Tensor:
        return prop.rows(graph.forward(x.to(graph.dtype)))

    def largest_row(x: torch.Tensor) -> torch.Tensor:
        return rows_at(x).amax(1, keepdim=True)

    def smooth_largest_row(x: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(rows_at(x), 1, keepdim=True)

    return [largest_row, smooth_largest_row]


def one_row(prop: Property) -> Property:
    """The box with one row ``1 * f + 0``: box-PGD on a loss given as a one-row model."""
    return Property(prop.lower, prop.upper, prop.spec.new_ones(1, 1, 1), prop.offset[:, :1] * 0)


class ConjunctionSearch(Search):
    """One sample's branch and bound on min_x max_k row_k (see the module docstring)."""

    def __init__(self, config, graph, prop, boxes, model, deadline, on_prune=None):
        super().__init__(config, graph, prop, boxes, model, deadline, on_prune)
        self.atoms = prop.spec.shape[1]
        self.best = math.inf  # the least objective of a pruned domain
        self.open: Domains | None = None
        self.stuck: list[torch.Tensor] = []
        self._starts: torch.Tensor | None = None  # the last round's attack starts

    def run(self, first: torch.Tensor) -> JointOutcome:
        """The search from each atom's proved bound on the box, ``first`` (K,), offset
        included (e.g. alpha-CROWN's)."""
        bound, slopes = self._root_bound(first)
        if float(bound.max()) > 0 or self.deadline.passed():
            return JointOutcome(float(bound.max()), None, "" if bound.max() > 0 else "timeout")
        spec, offset = self.prop.spec[0], self.prop.offset[0]
        rows = torch.arange(self.atoms)
        todo = root_domains(self.graph, self.root, spec, offset, rows, slopes)
        todo.bound = bound.clone()
        self.max_open = self._entries_kept(todo)
        try:
            point = self._rounds(todo)
        except OutOfTime:
            return self._joint_outcome("timeout")
        if point is not None:
            return JointOutcome(-math.inf, point, "")
        return self._joint_outcome("")

    def _root_bound(self, first: torch.Tensor):
        """Each atom's bound after ``root_steps`` on its output slopes (``bab``'s root,
        within ``bab.ROOT_SHARE`` of the time), never below ``first``, and those slopes."""
        if float(first.max()) > 0:
            return first, {}
        found = self._root_in_share(self.prop.spec[0], self.prop.offset[0])
        if found is None:  # the search gets the rest, from CROWN's slopes
            return first, {}
        bound, slopes = found
        return torch.maximum(first, bound.to(first.dtype)), slopes

    def _entries_kept(self, root: Domains) -> int:
        """Open entries kept at most: ``max_domains`` domains of K entries, within the
        domain store's memory (``bab.domain_memory``)."""
        per_entry = sum(t[0].numel() * t.element_size() for part in
                        (root.alpha, root.beta, root.splits) for t in part.values())  # fmt: skip
        memory = domain_memory(self.config.max_memory_mb, self.prop.lower.device)
        entries = min(self.config.max_domains * self.atoms, int(memory / max(1, per_entry)))
        return max(self.atoms, entries)

    def objective(self, d: Domains) -> torch.Tensor:
        """(G,) per domain the max over its atoms' bounds: a lower bound of max_k row_k."""
        return d.bound.reshape(-1, self.atoms).amax(1)

    def _lowest(self) -> float:
        """The least objective over pruned and open domains."""
        if self.open is None or not len(self.open):
            return self.best
        return min(self.best, float(self.objective(self.open).min()))

    def _entries(self, groups: torch.Tensor) -> torch.Tensor:
        """The entry indices of domains ``groups``, in their order."""
        return (groups[:, None] * self.atoms + torch.arange(self.atoms)).flatten()

    def _pruned(self, done: Domains) -> torch.Tensor:
        return (self.objective(done) > 0).repeat_interleave(self.atoms)

    def _prove(self, leaves: Domains) -> None:
        self.best = min(self.best, float(self.objective(leaves).min()))
        if self.on_prune is not None:
            self.on_prune(leaves)

    def _choose(self, d: Domains, coeff, at_relu, boxes) -> torch.Tensor:
        """Per entry the branch of its domain: the one its leading atom (highest bound)
        chooses, so the K entries of a domain split alike and stay one domain."""
        branch = super()._choose(d, coeff, at_relu, boxes).reshape(-1, self.atoms, 2)
        lead = d.bound.reshape(-1, self.atoms).argmax(1)
        return branch[torch.arange(len(lead)), lead].repeat_interleave(self.atoms, 0)

    def _best_first(self, open_: Domains) -> torch.Tensor:
        return self._entries(torch.argsort(self.objective(open_)))

    def _round_size(self) -> int:
        return self.atoms * max(1, self.config.domain_batch // self.atoms)

    def _corners(self, done: Domains, coeff: torch.Tensor) -> torch.Tensor | None:
        """Each entry's corner minimising its atom's linear bound, replayed: the first
        where every atom holds. Keeps the leading atoms' corners of the lowest domains
        for the next attack."""
        corner = into_box(torch.where(coeff[:, 0] > 0, done.lower, done.upper), self.prop)
        hit = all_hold(self.model, self.prop, corner)
        if hit.any():
            return corner[hit][:1]
        bound = done.bound.reshape(-1, self.atoms)
        order = torch.argsort(bound.amax(1))[:ATTACK_STARTS]
        lead = order * self.atoms + bound[order].argmax(1)
        self._starts = corner[lead]
        return None

    def _attack(self) -> torch.Tensor | None:
        """Box-PGD on the largest row, then its logsumexp, from the last round's starts."""
        if self._starts is None:
            return None
        starts, steps = self._starts, max(1, self.config.attack_steps // 2)
        single = one_row(self.prop).expand(len(starts))
        for loss in max_row_losses(self.graph, self.prop):
            point = into_box(pgd_on_rows(loss, single, steps, 0, start=starts), self.prop)
            hit = all_hold(self.model, self.prop, point)
            if hit.any():
                return point[hit][:1]
        return None

    def _joint_outcome(self, why: str) -> JointOutcome:
        """The least objective over open, unsplittable and pruned domains."""
        margin = self._lowest()
        if self.stuck:
            stuck = torch.cat(self.stuck)[:, 1].reshape(-1, self.atoms).amax(1)
            margin = min(margin, float(stuck.min()))
            why = why or "not split further"
        if not why and self.open is not None and len(self.open):
            why = "domain limit"
        return JointOutcome(margin, None, why)
