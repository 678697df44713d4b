"""Square's per-query draws served on the device, so that a query on a GPU never waits.

Square's redraw rule (``square.py``) depends on the windows' flags, which depend on the best
points, which depend on the model's last answer: deciding it on the host costs a
synchronisation per query. Here each sample's buffered uniforms are mirrored on the device,
in a ring of ``slots`` buffers of ``streams.BUFFER`` numbers in the order its stream serves
them, and its position in them lives on the device too. Each query gathers the corner, the
signs and every redraw the rule could need (``max_resamples - 1``) at once; the first
candidate that changes the window is taken and the position moves past the draws used. The
numbers are ``SampleStreams.uniforms_on_host``'s bit for bit: positions follow the streams'
rule (a draw that does not fit in the rest of a buffer starts the next one).

The host learns the positions late (``LaggedCopy``) and refills a sample's slot once the
sample has moved past it. A query moves a sample at most ``most`` numbers, so the host
knows how far each sample can be; when a sample might have reached beyond its resident
buffers (the host many queries ahead of the device), the host waits for older queries'
positions before that query: the fallback, tested with a ring of two slots. The ring holds
8 queries' worst case, so the host may run 8 queries ahead or more before it waits.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch

from aisafety.attack.score_search import LaggedCopy
from aisafety.attack.streams import BUFFER, SampleStreams


class DeviceDraws:
    """The uniforms of Square's queries for a batch's samples, gathered on the device.

    Per query a sample draws ``first`` numbers (corner and signs), then up to ``redraws``
    draws of ``redraw`` numbers (new signs), as ``SampleStreams.uniforms_on_host`` would
    serve them one after the other.
    """

    def __init__(
        self,
        streams: SampleStreams,
        first: int,
        redraw: int,
        redraws: int,
        device: torch.device,
        slots: int | None = None,
    ) -> None:
        self.streams, self.first, self.redraw, self.redraws = streams, first, redraw, redraws
        # a draw of k may skip k - 1 numbers at a buffer's end
        if not self.serves(first, redraw, redraws):
            raise ValueError(f"{redraws} redraws of {redraw} numbers cross two buffer ends")
        self.most = self.query_span(first, redraw, redraws)
        self.slots = slots or self.default_slots(first, redraw, redraws)
        if (self.slots - 1) * BUFFER < self.most:
            raise ValueError(f"{self.slots} slots cannot hold a query's {self.most} numbers")
        n = len(streams)
        current, positions = streams.buffered_uniforms()
        ring = torch.empty((n, self.slots, BUFFER), pin_memory=device.type == "cuda")
        ring[:, 0] = torch.from_numpy(current)
        for slot in range(1, self.slots):
            streams.next_uniform_buffers(np.arange(n), ring[:, slot])
        self.ring = ring.view(n, -1).to(device)
        self.position = torch.from_numpy(positions).to(device)  # in buffers 0, 1, ... in turn
        self.lowest = np.zeros(n, dtype=np.int64)  # the oldest buffer each ring holds
        self.seen = LaggedCopy(self.position)
        self.table = self.table_on(first, redraw, redraws, device)
        self.span = first + redraws * redraw

    def prepare(self, rows: np.ndarray) -> None:
        """Before a query of ``rows``: refill the slots their samples have moved past; where a
        sample might otherwise run beyond its ring, wait for older queries' positions first
        (the fallback; with every position known, the ring holds a query's numbers)."""
        self._refill()
        while (
            self.seen.lag and (self._reach(rows) > (self.lowest[rows] + self.slots) * BUFFER).any()
        ):
            self.seen.wait_one()
            self._refill()

    def _reach(self, rows: np.ndarray) -> np.ndarray:
        """How far each of ``rows`` can be in its stream after the next query."""
        return self.seen.host[rows] + (self.seen.lag + 1) * self.most

    def _refill(self) -> None:
        """Replace every buffer a sample has moved past with its next one."""
        behind = self.seen.latest() // BUFFER - self.lowest
        while (behind > 0).any():
            rows = np.flatnonzero(behind > 0)
            fresh = torch.empty((len(rows), BUFFER), pin_memory=self.ring.device.type == "cuda")
            self.streams.next_uniform_buffers(rows, fresh)
            slot = (self.lowest[rows] % self.slots) * BUFFER
            where = torch.from_numpy(rows[:, None] * self.ring.shape[1] + slot[:, None])
            where = where + torch.arange(BUFFER)
            self.ring.view(-1)[where.to(self.ring.device, non_blocking=True)] = fresh.to(
                self.ring.device, non_blocking=True
            )
            self.lowest[rows] += 1
            behind[rows] -= 1

    @staticmethod
    def query_span(first: int, redraw: int, redraws: int) -> int:
        """The most numbers one query moves a sample (each draw of k may skip k - 1)."""
        return 2 * first - 1 + redraws * (2 * redraw - 1)

    @classmethod
    def default_slots(cls, first: int, redraw: int, redraws: int) -> int:
        """Buffers per sample: 8 queries' worst case, and at least 4."""
        return 1 + max(3, math.ceil(8 * cls.query_span(first, redraw, redraws) / BUFFER))

    @classmethod
    def sample_bytes(cls, first: int, redraw: int, redraws: int) -> int:
        """Device bytes one sample's ring holds (float32), for the memory budget."""
        return cls.default_slots(first, redraw, redraws) * BUFFER * 4

    @staticmethod
    def serves(first: int, redraw: int, redraws: int) -> bool:
        """Whether a query's redraws cross at most one buffer end (the closed form ``draw``
        uses: true for Square's default 99 redraws of up to 10 channels); Square decides
        its redraws on the host otherwise."""
        return max(first, redraw) <= BUFFER // 2 and redraws <= BUFFER // redraw

    @staticmethod
    @lru_cache(maxsize=8)
    def table_on(first: int, redraw: int, redraws: int, device: torch.device) -> torch.Tensor:
        """``offsets`` on ``device``, made once per process for each (draw sizes, device):
        every call of Square on a batch (a chunk) made it anew before, 1024 x 402 int64
        (3.3 MB) for 3 channels. Read only: ``draw`` indexes it (a copy)."""
        return DeviceDraws.offsets(first, redraw, redraws).to(device)

    @staticmethod
    def offsets(first: int, redraw: int, redraws: int) -> torch.Tensor:
        """Per position in a buffer (BUFFER, first + redraws * redraw + redraws + 1): where
        a query's numbers lie from there, then where the sample is after 0 .. ``redraws``
        redraws used. The streams' rule depends on the position's offset in its buffer
        only, so it is worked out once here and a query looks it up (a few launches on a
        GPU instead of some twenty small ones a query)."""
        offset = torch.arange(BUFFER)[:, None]
        # the first draw starts the next buffer if it does not fit in this one's rest
        start = (offset > BUFFER - first) * (BUFFER - offset)
        # the redraws follow it up to the buffer's end, then (past the ``skip`` numbers
        # that cannot hold one) in the next buffer: from ``threshold`` on in ``pattern``
        room = BUFFER - (offset + start + first) % BUFFER
        skip = room % redraw
        threshold = room - skip + first
        pattern = torch.arange(first + redraws * redraw)  # counted from the first draw's start
        at = start + pattern + (pattern >= threshold) * skip
        end = torch.arange(redraws + 1) * redraw + first  # past the first draw and the redraws
        after = start + end + (end > threshold) * skip
        return torch.cat([at, after], 1)

    def draw(self, rows: torch.Tensor) -> torch.Tensor:
        """For the samples ``rows``: the first draw and every redraw after it, one after the
        other (m, first + redraws * redraw); ``advance`` then moves past those used."""
        position = self.position[rows]
        ahead = self.table[position % BUFFER]
        self._cursor = position, ahead[:, self.span :]
        at = position[:, None] + ahead[:, : self.span]
        return self.ring[rows[:, None], at % self.ring.shape[1]]

    def advance(self, rows: torch.Tensor, used: torch.Tensor) -> None:
        """Move each sample of the last ``draw`` past its first draw and ``used`` redraws."""
        position, after = self._cursor
        self.position[rows] = position + after.gather(1, used[:, None]).squeeze(1)
        self.seen.push(self.position)
