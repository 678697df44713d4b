"""In which order the Ray driver submits a plan's tasks (docs/scale-out.md, "What runs where").

The driver keeps only as many tasks in flight as the cluster runs at once and picks the next
one itself, because Ray's queue does not know which task finishes a unit: with every shard
submitted up front, a unit's join waited behind the shards of later units, so finished
attacks were stored (and counted by the progress) only near the end of the plan, and a
killed run lost them. Here a unit's join is submitted as soon as its last shard finishes,
before any further shard. Plain Python (no Ray), so the order is testable on its own.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from aisafety.runner import WorkUnit


@dataclass(frozen=True)
class Task:
    """One task to submit: ``kind`` is "unit" (a whole unsharded attack unit: attack,
    metrics, rows), "shard" (one shard of a unit's attack), "join" (a sharded unit's
    metrics and rows, from its shards) or "clean" (the clean unit)."""

    kind: str
    unit: WorkUnit
    shard: int | None = None

    @property
    def stores_unit(self) -> bool:
        """Whether the unit is done (stored or failed) when this task is."""
        return self.kind != "shard"


class Schedule:
    """What to submit next: a join whose shards are all done first (it stores a unit), then
    the attack work in the plan's order (a unit's shards one after the other), and the clean
    unit last, once every attack task exists: its metrics may read any attack's result
    through the attacks' object references (the certified metrics reuse the plan's PGD)."""

    def __init__(self, units: list[WorkUnit], n_shards: int | None) -> None:
        """``units``: the units still to do; ``n_shards``: shards per attack unit, or None
        for one task per unit (no ``shard_size``)."""
        attacked = [u for u in units if u.attack is not None]
        self._attack_work: deque[Task] = deque(
            Task("unit", u) if n_shards is None else Task("shard", u, i)
            for u in attacked
            for i in range(1 if n_shards is None else n_shards)
        )
        self._clean: deque[Task] = deque(Task("clean", u) for u in units if u.attack is None)
        self._shards_left = {u.key: n_shards for u in attacked} if n_shards else {}
        self._joins: deque[Task] = deque()

    def next(self) -> Task | None:
        """The task to submit now; None while nothing can be submitted before a task in
        flight finishes (or when the plan is done)."""
        for queue in (self._joins, self._attack_work):
            if queue:
                return queue.popleft()
        return self._clean.popleft() if self._clean else None

    def finished(self, task: Task) -> None:
        """``task`` is done (succeeded or failed: a failed shard fails its join, which
        records the unit's failure with the shard's error)."""
        if task.kind == "shard":
            self._shards_left[task.unit.key] -= 1
            if self._shards_left[task.unit.key] == 0:
                self._joins.append(Task("join", task.unit))
