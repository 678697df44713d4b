"""Per-sample random streams: a sample's random draws depend on the seed and its index only.

With one generator for a whole batch, what sample ``i`` draws depends on how many draws the
samples before it took: on the chunk it landed in (``batch_size``), and on which of its
neighbours were still being attacked. Here every sample index has a ``torch.Generator`` of
its own, seeded from ``(seed, index)`` (splitmix64), so an attack's result for a sample is
the same whatever the chunking, provided the attack draws for exactly the samples it works
on (``streams[rows]``) and decides per sample when to stop.

Speed: query attacks draw a handful of numbers per sample and iteration (Square's window
corner and signs), and a Python loop over the samples on every draw would cost more than
the model. So small draws are served from a buffer of ``BUFFER`` numbers per sample, refilled
from the sample's generator (one call per sample every ``BUFFER / k`` draws), with one
gather per draw; draws of more than ``BUFFER / 2`` numbers per sample (a random start, a
population of noise images) call each sample's generator directly. Generators are created
on a sample's first draw. ``bench/streams.py`` measures the cost against one shared
generator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextvars import copy_context

import numpy as np
import torch

from aisafety import randomness

BUFFER = 1024  # buffered numbers per sample and kind (uniform, normal)
PARALLEL_DRAW = 1 << 20  # numbers in a direct draw from which it is spread over threads
_MASK = (1 << 64) - 1


def sample_seed(seed: int, index: int) -> int:
    """A 63-bit seed for sample ``index`` of a call seeded with ``seed`` (splitmix64 of the
    pair: neighbouring indices and seeds give unrelated streams)."""
    z = (seed * 0x9E3779B97F4A7C15 + (index + 1) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return (z ^ (z >> 31)) >> 1


class _Pool:
    """The generators and buffers of one call's samples (shared by every view of them).

    Buffers, rows and buffer positions are on the host: the bookkeeping of a draw costs
    microseconds and no device synchronisation, a refill is one generator call per sample
    and no copy, and an attack may decide on buffered numbers without asking the device
    (Square's redraws); a draw's numbers are gathered on the host and copied to the device
    in one transfer.
    """

    def __init__(self, seed: int, samples: Sequence[int], device: torch.device):
        self.seed, self.samples, self.device = seed, list(samples), device
        self.generators: list[torch.Generator | None] = [None] * len(self.samples)
        n = len(self.samples)
        self.buffers = {kind: np.empty((n, BUFFER), dtype=np.float32) for kind in ("rand", "randn")}
        # where each sample's next buffered number is (BUFFER: empty)
        self.positions = {kind: np.full(n, BUFFER, dtype=np.int64) for kind in self.buffers}

    def generator(self, row: int) -> torch.Generator:
        made = self.generators[row]
        if made is None:
            made = torch.Generator()  # host: the same numbers on every device
            made.manual_seed(sample_seed(self.seed, self.samples[row]))
            self.generators[row] = made
        return made

    def direct(self, kind: str, rows: np.ndarray, k: int) -> torch.Tensor:
        """Each row's ``k`` numbers from its own generator, written in place into one host
        tensor (pinned for a GPU, so the copy runs asynchronously). A large draw (a random
        start at 224x224: 64 x 150,528 numbers) is split over torch's intra-op threads, one
        sample per task: each generator is independent, so the numbers are those of a
        sequential draw, and the host's share of a GPU step shrinks with its core count."""
        draw = torch.rand if kind == "rand" else torch.randn
        rows_list = rows.tolist()
        generators = [self.generator(r) for r in rows_list]
        pinned = self.device.type == "cuda"
        out = torch.empty((len(rows_list), k), pin_memory=pinned)

        def fill(i: int) -> None:
            draw(k, generator=generators[i], out=out[i])

        workers = min(torch.get_num_threads(), len(rows_list))
        if workers > 1 and k * len(rows_list) >= PARALLEL_DRAW:
            # each task in a copy of this thread's context: a warning raised there goes to
            # the unit's log (warning_log.py), and the unit's context variables (scoped.py)
            # are those of the thread that asked
            with ThreadPoolExecutor(workers) as pool:
                tasks = [pool.submit(copy_context().run, fill, i) for i in range(len(rows_list))]
                for task in tasks:
                    task.result()
        else:
            for i in range(len(rows_list)):
                fill(i)
        return out.to(self.device, non_blocking=pinned)

    def buffered(self, kind: str, rows: np.ndarray, k: int) -> np.ndarray:
        """Each row's next ``k`` buffered numbers, (rows, k), on the host; a row whose buffer
        holds fewer than ``k`` draws a full buffer first (the rest of the old one is unused)."""
        buffer, positions = self.buffers[kind], self.positions[kind]
        start = positions[rows]
        empty = start + k > BUFFER
        if empty.any():
            draw = torch.rand if kind == "rand" else torch.randn
            for r in rows[empty].tolist():
                draw(BUFFER, generator=self.generator(r), out=torch.from_numpy(buffer[r]))
            positions[rows[empty]] = 0
            start = positions[rows]
        positions[rows] = start + k
        return buffer[rows[:, None], start[:, None] + np.arange(k)]

    def available(self, kind: str, rows: np.ndarray, k: int) -> np.ndarray:
        """Per row, how many draws of ``k`` numbers its buffer serves before a refill."""
        return (BUFFER - self.positions[kind][rows]) // k

    def peek(self, kind: str, rows: np.ndarray, k: int, draws: int) -> np.ndarray:
        """The next ``draws`` draws of ``k`` numbers per row, (rows, draws, k), left in the
        buffer; only a row's first ``available`` draws are its numbers (the rest: filler)."""
        start = self.positions[kind][rows]
        offsets = start[:, None, None] + (np.arange(draws) * k)[None, :, None] + np.arange(k)
        return self.buffers[kind][rows[:, None, None], np.minimum(offsets, BUFFER - 1)]

    def consume(self, kind: str, rows: np.ndarray, k: int, draws: np.ndarray) -> None:
        """Take ``draws`` (per row, at most ``available``) draws of ``k`` numbers as drawn."""
        self.positions[kind][rows] += draws * k


class SampleStreams:
    """The random streams of a batch's samples, one per sample (see the module docstring).

    ``streams[rows]`` (an index tensor or boolean mask over the batch) is the streams of
    those samples, sharing their state: drawing from it advances only those samples.
    Every draw's first dimension is the batch: ``rand((len(streams), ...))``.
    """

    def __init__(
        self,
        seed: int,
        samples: torch.Tensor | Sequence[int],
        device: torch.device | str = "cpu",
        *,
        _pool: _Pool | None = None,
        _rows: np.ndarray | None = None,
    ):
        if _pool is None:
            indices = samples.tolist() if isinstance(samples, torch.Tensor) else list(samples)
            _pool = _Pool(int(seed), indices, torch.device(device))
            _rows = np.arange(len(indices), dtype=np.int64)
        self._pool, self._rows = _pool, _rows

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def device(self) -> torch.device:
        return self._pool.device

    @property
    def samples(self) -> list[int]:
        """The sample indices (of the caller's batch) these streams belong to."""
        return [self._pool.samples[r] for r in self._rows.tolist()]

    def __getitem__(self, rows: torch.Tensor | slice) -> SampleStreams:
        if isinstance(rows, torch.Tensor):
            rows = (rows if rows.device.type == "cpu" else rows.cpu()).numpy()
        return SampleStreams(0, (), _pool=self._pool, _rows=self._rows[rows].reshape(-1))

    def _draw(self, kind: str, shape: Sequence[int]) -> torch.Tensor:
        shape = tuple(int(s) for s in shape)
        if not shape or shape[0] != len(self):
            raise ValueError(
                f"a draw from the streams of {len(self)} samples needs shape "
                f"({len(self)}, ...), got {shape}"
            )
        k = math.prod(shape[1:])
        if k == 0 or not len(self):
            return torch.empty(shape, device=self.device)
        if k > BUFFER // 2:
            out = self._pool.direct(kind, self._rows, k)
        else:
            out = torch.from_numpy(self._pool.buffered(kind, self._rows, k)).to(self.device)
        return out.view(shape)

    def rand(self, shape: Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Uniform in [0, 1), per sample from its own stream."""
        return self._draw("rand", shape).to(dtype)

    def randn(self, shape: Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Standard normal, per sample from its own stream."""
        return self._draw("randn", shape).to(dtype)

    def randint(self, low: int, high: int, shape: Sequence[int]) -> torch.Tensor:
        """Integers uniform in [low, high) (int64; from a float32 uniform: for small ranges,
        as the attacks' window positions and coin flips)."""
        if high - low > 1 << 20:
            raise ValueError(f"randint over {high - low} values is too wide for a float draw")
        drawn = scaled(self._draw("rand", shape), high - low)
        return drawn.add_(low) if low else drawn

    def uniforms_on_host(self, k: int) -> np.ndarray:
        """``rand((n, k))``'s numbers (k <= BUFFER / 2) as a host array (n, k), not copied to
        the device: for decisions the host makes on them (Square's signs and redraws)."""
        if k > BUFFER // 2:
            raise ValueError(f"a host draw takes at most {BUFFER // 2} numbers per sample, not {k}")
        return self._pool.buffered("rand", self._rows, k)

    def available_uniforms(self, k: int) -> np.ndarray:
        """Per sample, how many ``rand((n, k))`` draws its buffer serves before a refill (a
        caller may then ``peek_uniforms`` that far ahead without changing any number)."""
        return self._pool.available("rand", self._rows, k)

    def peek_uniforms(self, k: int, draws: int) -> np.ndarray:
        """(n, draws, k), on the host: what the next ``draws`` calls of ``rand((n, k))`` would
        return, for each sample's first ``available_uniforms(k)`` of them; nothing is drawn."""
        return self._pool.peek("rand", self._rows, k, draws)

    def consume_uniforms(self, k: int, draws: np.ndarray) -> None:
        """Count ``draws[i]`` peeked draws of sample ``i`` as drawn."""
        self._pool.consume("rand", self._rows, k, np.asarray(draws, dtype=np.int64))

    def buffered_uniforms(self) -> tuple[np.ndarray, np.ndarray]:
        """Each sample's current buffer of uniforms (n, BUFFER) and where its next number is
        (BUFFER: empty): with ``next_uniform_buffers`` the numbers ``rand`` would serve, for a
        caller that serves them itself (Square's draws on a GPU, ``square_draws.py``)."""
        pool = self._pool
        return pool.buffers["rand"][self._rows].copy(), pool.positions["rand"][self._rows].copy()

    def next_uniform_buffers(self, rows: np.ndarray, out: torch.Tensor) -> None:
        """The next buffer of uniforms of each sample in ``rows`` (indices into these streams)
        into ``out`` (len(rows), BUFFER), as a refill would draw it. The streams' own buffers
        are not moved: after this, draw only through the caller that took them over."""
        pool = self._pool
        for i, r in enumerate(self._rows[rows].tolist()):
            torch.rand(BUFFER, generator=pool.generator(r), out=out[i])

    def signs(self, shape: Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """+1 or -1 with probability 1/2 each (Rademacher)."""
        u = self._draw("rand", shape)
        return u.lt_(0.5).to(dtype).mul_(2).sub_(1)


def scaled(uniform: torch.Tensor, n: int) -> torch.Tensor:
    """Uniforms in [0, 1) as integers uniform in [0, n) (for small n)."""
    return (uniform * n).long().clamp_max_(n - 1)


# Code shared with training (one generator for a batch) draws through these: either kind.
RandomSource = torch.Generator | SampleStreams


def rand(source: RandomSource, shape: Sequence[int], device: torch.device) -> torch.Tensor:
    if isinstance(source, SampleStreams):
        return source.rand(shape)
    return randomness.rand(shape, source, device)


def randn(source: RandomSource, shape: Sequence[int], device: torch.device) -> torch.Tensor:
    if isinstance(source, SampleStreams):
        return source.randn(shape)
    return randomness.randn(shape, source, device)


def randint(
    source: RandomSource, low: int, high: int, shape: Sequence[int], device: torch.device
) -> torch.Tensor:
    if isinstance(source, SampleStreams):
        return source.randint(low, high, shape)
    return randomness.randint(low, high, shape, source, device)
