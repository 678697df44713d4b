"""The bookkeeping of a score-based random search (Square l-inf and l2), kept off the device.

Every query of such a search does the same around the model call: find the samples still
classified correctly, query their proposals, keep each improvement. On a GPU with a small
model a query costs little device time and the search is bound by the host: kernel launches
and synchronisations. So which samples are active live on the host, read from a copy of the
``margin > 0`` flags that the host does not wait for (``LaggedCopy``; a ``nonzero`` and a
copy of its indices were two synchronisations a query), and the scores' finiteness
is accumulated on the device and checked once at the end (``Predictor.check_output`` on
every query was one more synchronisation). A NaN score is still refused, naming the model:
after the search instead of at the query that produced it.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

from aisafety.errors import ModelOutputError
from aisafety.prediction.base import Predictor


def margin_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``logit[y] - max_{j != y} logit[j]``: positive while the sample is classified as y."""
    true = logits.gather(1, y[:, None]).squeeze(1)
    others = logits.scatter(1, y[:, None], float("-inf"))
    return true - others.amax(1)


class LaggedCopy:
    """A device tensor as the host last saw it without waiting for the device.

    On a GPU each ``push`` copies the tensor into pinned host memory without waiting;
    ``latest`` returns the newest copy that has arrived (``torch.cuda.Event``), which may be
    a few pushes old (``lag``). On the CPU a push is read at once. Square's search reads its
    ``margin > 0`` flags this way (a superset of the rows still to attack, never a subset: a
    margin only goes down), and its device draws their positions (``square_draws.py``).
    """

    def __init__(self, value: torch.Tensor) -> None:
        self.host = value.cpu().numpy().copy()
        self.pending: deque[tuple[torch.Tensor, torch.cuda.Event]] = deque()
        self.pushed = self.arrived = 0

    def push(self, value: torch.Tensor) -> None:
        self.pushed += 1
        if value.device.type != "cuda":
            self.host, self.arrived = value.numpy().copy(), self.pushed
            return
        copy = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
        copy.copy_(value, non_blocking=True)
        arrived = torch.cuda.Event()
        arrived.record()
        self.pending.append((copy, arrived))

    def latest(self) -> np.ndarray:
        """The newest copy that has arrived."""
        while self.pending and self.pending[0][1].query():
            self._take()
        return self.host

    def wait_one(self) -> None:
        """Wait for the oldest copy still on its way (the device works on meanwhile)."""
        if self.pending:
            self.pending[0][1].synchronize()
            self._take()

    def _take(self) -> None:
        copy, _ = self.pending.popleft()
        self.host, self.arrived = copy.numpy(), self.arrived + 1

    @property
    def lag(self) -> int:
        """Pushes made since the copy ``latest`` last returned."""
        return self.pushed - self.arrived


class ScoreSearch:
    """The margins, best points and query counts of one search over a batch.

    ``best`` and ``margin`` start from the initial proposal (its query counted, its scores
    checked); ``active`` gives the rows still to attack, ``update`` keeps what improved.
    ``active`` may name a row fooled by the query before (a GPU's flags arrive a query
    late, so the host never waits for the model): ``update`` leaves such a row as it is and
    does not count its query, so the result is the same as with the exact rows, the CPU's.
    """

    def __init__(self, predictor: Predictor, y: torch.Tensor, start: torch.Tensor) -> None:
        self.predictor, self.y, self.best = predictor, y, start
        self.margin = margin_loss(predictor.logits(start), y)
        self.used = torch.ones(len(y), dtype=torch.long, device=y.device)
        self.finite = torch.ones((), dtype=torch.bool, device=y.device)
        self.flags = LaggedCopy(self.margin > 0)

    def active(self) -> tuple[np.ndarray, torch.Tensor]:
        """The rows whose margin is still positive (or was a query ago), on the host and on
        the device."""
        rows = np.flatnonzero(self.flags.latest())
        on_device = torch.from_numpy(rows)
        if self.y.device.type != "cpu":
            on_device = on_device.to(self.y.device, non_blocking=True)
        return rows, on_device

    def query(self, proposal: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The margins of the proposals of ``rows`` (scores checked for layout now and for
        finiteness in ``finish``)."""
        self.predictor.check_input_layout(proposal)
        scores = self.predictor.watched_logits(proposal)
        self.finite &= torch.isfinite(scores).all()
        return margin_loss(scores, self.y[rows])

    def update(
        self, rows: np.ndarray, on_device: torch.Tensor, proposal: torch.Tensor,
        current: torch.Tensor, new_margin: torch.Tensor,
    ) -> None:  # fmt: skip
        """Keep each row's proposal where its margin went down; count the query (rows
        fooled already are left as they are)."""
        improved = self._count(on_device, new_margin)
        self.best[on_device] = torch.where(improved[:, None, None, None], proposal, current)

    def update_windows(
        self, rows: np.ndarray, on_device: torch.Tensor, flat: torch.Tensor,
        window: torch.Tensor, before: torch.Tensor, new_margin: torch.Tensor,
    ) -> None:  # fmt: skip
        """``update`` for proposals that differ from the rows' best points only at the flat
        indices ``flat`` (m, k) of contiguous images (new values ``window``, old ``before``):
        only those are written back, the same points as ``update``'s."""
        improved = self._count(on_device, new_margin)
        kept = torch.where(improved[:, None], window, before)
        self.best.view(len(self.best), -1)[on_device[:, None], flat] = kept

    def _count(self, on_device: torch.Tensor, new_margin: torch.Tensor) -> torch.Tensor:
        """Keep the margins that went down and count the query of each open row; the rows
        whose margin went down."""
        old = self.margin[on_device]
        open_ = old > 0
        improved = (new_margin < old) & open_
        self.margin[on_device] = torch.where(improved, new_margin, old)
        self.used.index_add_(0, on_device, open_.long())
        self.flags.push(self.margin > 0)
        return improved

    def finish(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The best points and query counts, once every score was seen to be finite."""
        if not bool(self.finite):
            raise ModelOutputError(
                f"model {self.predictor.name!r} returned NaN or infinite scores for a query "
                "of a score-based attack; nothing was stored. Check the weights (NaN after "
                "training?) and the normalisation (a std of 0 divides by zero)"
            )
        return self.best, self.used
