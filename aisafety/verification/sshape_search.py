"""``bab``'s search on a network with sigmoid or tanh activations, once the root's slopes
(``bab.Search``) left rows open: rounds of alpha-CROWN on every bound, then branch and
bound over the S-shape neurons (domains, bounds and splits: ``sshape_split.py``).

Kept apart from ``bab.py``, which holds the ReLU search: the two share only the root, the
clock and the outcome. Every bound reported is a sound lower bound of its row on the whole
input box: a round's bound is a rounding-safe pass on boxes sound there, and a row's open
or proved domains together cover its box (``sshape_split.py``).
"""

from __future__ import annotations

import torch

from aisafety.verification.bounds import linear_boxes, optimise_slopes
from aisafety.verification.deadline import Deadline, OutOfTime, time_limit
from aisafety.verification.falsify import Model, replay
from aisafety.verification.float64_margin import added_down
from aisafety.verification.graph import BoundGraph
from aisafety.verification.ops import Box
from aisafety.verification.property import Property
from aisafety.verification.split_bounds import empty_domains
from aisafety.verification.sshape_split import (
    SDomains,
    bound_sdomains,
    branch_scores,
    root_sdomains,
    split_sdomains,
)

STALLED = 0.01  # of an open row's gap to 0 closed by one round of slope search
# the sigmoid/tanh slope rounds' share of a sample's time; the splits get the rest
SLOPE_SHARE = 0.5
# rounds of S-shape splitting in a row whose lowest open bound rose by less than STALLED
SSHAPE_STALL_ROUNDS = 10


def stalled(before: torch.Tensor, now: torch.Tensor) -> bool:
    """No open row (``before`` <= 0) rose by ``STALLED`` of its gap to 0 in the round."""
    open_ = before <= 0
    return bool(((now - before)[open_] < STALLED * -before[open_]).all())


class SShapeSearch:
    """One sample's search after the root (``prop`` one sample, ``root`` the root's boxes,
    ``proved`` the lowest proved bound per row, inf where none; ``memory`` the bytes the
    open domains may take, ``steps`` the Adam steps per round)."""

    def __init__(self, config, graph: BoundGraph, prop: Property, root: list[Box],
                 model: Model, deadline: Deadline, proved: torch.Tensor, memory: int,
                 steps: int):  # fmt: skip
        self.config, self.graph, self.prop, self.root = config, graph, prop, root
        self.model, self.deadline, self.proved = model, deadline, proved
        self.memory, self.steps = memory, steps
        self.stuck: list[torch.Tensor] = []  # (row, bound) of domains that cannot be split
        self.open_s: SDomains | None = None
        self.rounds = 0

    def run(self, root_bound, rows, spec, offset):
        """Rounds of slope search on the whole box (``slope_rounds``) for ``SLOPE_SHARE``
        of the time or until they stall, then branch and bound over the S-shape neurons on
        their boxes. The bound per row, a replayed counterexample or None, and why it
        stopped short (or '')."""
        share = self.deadline.share(SLOPE_SHARE)
        best, boxes = self.slope_rounds(root_bound, rows, spec, offset, share)
        self.proved[best > 0] = best[best > 0]
        keep = best[rows] <= 0
        if not keep.any() or self.deadline.passed():
            return self._slopes_outcome(best, "timeout")
        rows, spec, offset = rows[keep], spec[keep], offset[keep]
        todo = root_sdomains(boxes, spec, offset, rows)
        todo.bound = best[rows].clone()
        return self.branch_and_bound(todo)

    def slope_rounds(self, root_bound, rows, spec, offset, deadline: Deadline):
        """Rounds of alpha-CROWN with twice the last round's Adam steps on every intermediate
        bound (the intermediate boxes decide these bounds: more output steps alone left
        them unchanged, docs/certification.md), each box intersected with the last, then
        ``root_steps`` on the open rows, until every row is proved, ``deadline`` passes, or
        a round closes less than ``STALLED`` of every open row's gap to 0 (each round costs
        twice the last). The best bound per row (every round's is sound) and the last
        boxes, sound on the whole box."""
        graph, config, boxes = self.graph, self.config, self.root
        best, steps, before = root_bound.clone(), max(1, config.steps), None
        try:
            with time_limit(deadline):
                while (best[rows] <= 0).any():
                    if before is not None and stalled(before, best[rows]):
                        break
                    before = best[rows].clone()
                    steps *= 2
                    box = self.prop.lower, self.prop.upper
                    fresh = linear_boxes(graph, *box, "adaptive", steps)
                    boxes = [(lo.maximum(was[0]), hi.minimum(was[1]))
                             for (lo, hi), was in zip(fresh, boxes, strict=True)]  # fmt: skip
                    bound, _ = optimise_slopes(graph, boxes, spec.unsqueeze(0).to(graph.dtype),
                                               config.root_steps, config.root_lr)  # fmt: skip
                    best[rows] = torch.maximum(
                        best[rows], added_down(bound[0], offset).to(best.dtype)
                    )
        except OutOfTime:
            pass
        return best, boxes

    def branch_and_bound(self, todo: SDomains):
        """Best-first branch and bound over S-shape neurons: each round splits the
        ``domain_batch`` lowest open domains (``branch_scores``, ``split_sdomains``) and
        bounds the children in one batch; a child above 0 is pruned, a replayed corner
        that violates the property ends the search. Stops when no domain is left, out of
        time, at the memory cap, or after ``SSHAPE_STALL_ROUNDS`` rounds in which the
        lowest open bound rose by less than ``STALLED`` of its gap to 0."""
        graph, config = self.graph, self.config
        cap = max(1, int(self.memory / max(1, todo.nbytes(graph))))
        cap = min(cap, config.max_domains)
        why, low, flat = "", None, 0
        try:
            with time_limit(self.deadline):
                while todo is not None:
                    self._inflight_s = todo
                    bound, coeff, at_act = bound_sdomains(graph, todo, self.steps, config.bab_lr)
                    self._inflight_s = None
                    todo.bound = torch.maximum(todo.bound, bound.to(todo.bound.dtype))
                    todo.bound[empty_domains(todo.boxes)] = torch.inf
                    point = self._replay_corners(todo, coeff)
                    if point is not None:  # the bounds stay those of every domain left
                        self.open_s = SDomains.cat([p for p in (self.open_s, todo) if p])
                        return self._outcome("")[0], point, ""
                    self._keep_open(todo, at_act)
                    if self.open_s is None:
                        break
                    now = float(self.open_s.bound.min())
                    if low is None or now - low >= STALLED * -low:
                        low, flat = now, 0
                    else:
                        flat += 1
                    if flat >= SSHAPE_STALL_ROUNDS:
                        why = "not split further (stalled)"
                        break
                    if len(self.open_s) > cap:
                        why = "domain limit"
                        break
                    self.rounds += 1
                    order = torch.argsort(self.open_s.bound)
                    n = min(config.domain_batch, len(order))
                    parents, rest = self.open_s.take(order[:n]), self.open_s.take(order[n:])
                    self.open_s = rest if len(rest) else None
                    todo = split_sdomains(graph, parents)
        except OutOfTime:
            why = "timeout"
            if self._inflight_s is not None:
                self.open_s = SDomains.cat([d for d in (self.open_s, self._inflight_s)
                                            if d is not None])  # fmt: skip
        return self._outcome(why)

    _inflight_s: SDomains | None = None

    def _replay_corners(self, d: SDomains, coeff: torch.Tensor) -> torch.Tensor | None:
        """The input corner minimising each domain's linear bound, replayed."""
        lo, hi = d.boxes[0]
        corner = torch.where(coeff > 0, lo, hi)
        hit = replay(self.model, self.prop.expand(len(d)), corner)
        return corner[hit][0] if hit.any() else None

    def _keep_open(self, d: SDomains, at_act) -> None:
        """Prune the proved domains (their bounds count for their rows), and keep the rest
        with their branching choice; a domain with nothing left to split is stuck."""
        proved = d.bound > 0
        leaves = torch.nonzero(proved).flatten()
        self.proved.scatter_reduce_(0, d.row[leaves], d.bound[leaves].to(self.proved.dtype),
                                    "amin")  # fmt: skip
        keep = torch.nonzero(~proved).flatten()
        if not len(keep):
            return
        rest = d.take(keep)
        node, index, _ = branch_scores(self.graph, rest, {i: a[keep] for i, a in at_act.items()})
        stuck = node < 0
        if stuck.any():
            gone = rest.take(torch.nonzero(stuck).flatten())
            self.stuck.append(torch.stack([gone.row.double(), gone.bound.double()], 1))
        live = torch.nonzero(~stuck).flatten()
        rest = rest.take(live)
        rest.branch = torch.stack([node[live], index[live]], 1)
        parts = [p for p in (self.open_s, rest) if p is not None and len(p)]
        self.open_s = SDomains.cat(parts) if parts else None

    def _outcome(self, why: str):
        bounds = self.proved.clone()
        if self.open_s is not None and len(self.open_s):
            d = self.open_s
            bounds.scatter_reduce_(0, d.row, d.bound.to(bounds.dtype), "amin")
        if self.stuck:
            stuck = torch.cat(self.stuck)
            bounds.scatter_reduce_(0, stuck[:, 0].long(), stuck[:, 1], "amin")
            why = why or "not split further"
        return bounds, None, why if (bounds <= 0).any() else ""

    def _slopes_outcome(self, best: torch.Tensor, why: str):
        self.proved[best > 0] = best[best > 0]
        bounds = torch.minimum(self.proved, best)
        return bounds, None, "" if (bounds > 0).all() else why
