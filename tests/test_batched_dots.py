"""The rounding margins' float64 sums over many samples with short rows (#32).

Cropped CROWN passes send thousands of (image, position) samples with a few short rows each
to ``rounding.dots``; they go through ``bmm`` over chunks of samples, not a loop over the
samples. The sums run in another order than one product per sample, which
``_float64_error``'s ``gamma(n, U64)`` covers (checked here against exact rational sums);
and a sample's result depends only on its own rows, whatever batch or chunk it is in.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from aisafety.verification import bounds as b
from aisafety.verification import receptive, rounding
from aisafety.verification.graph import build_graph
from tests.test_receptive_residual import node_values, resnet


def rows_and_columns(batch: int, k: int, n: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(batch, k, n, generator=gen) * 10.0 ** torch.randint(-6, 6, (batch, k, n),
                                                                         generator=gen)  # fmt: skip
    a[torch.rand(batch, k, n, generator=gen) < 0.3] = 0  # ReLU coefficients have zeros
    signed = torch.randn(batch, n, 1, generator=gen, dtype=torch.float64)
    absolute = torch.rand(batch, n, 2, generator=gen, dtype=torch.float64) * 1e3
    return a, signed, absolute


def test_short_rows_of_many_samples_take_no_loop_over_the_samples(monkeypatch):
    """Many samples with short rows: batched; a sample with many long rows: its own product
    (faster there, docs/certification.md)."""
    loops = []
    reference = rounding.per_sample_dots
    monkeypatch.setattr(rounding, "per_sample_dots", lambda *x: loops.append(1) or reference(*x))
    rounding.dots(*rows_and_columns(300, 16, 72))
    assert loops == []
    rounding.dots(*rows_and_columns(3, 32, 968))
    assert loops == [1]


@pytest.mark.parametrize("shape", [(300, 16, 72), (7, 10, 8), (5, 1, 784), (9, 3, 2000)])
def test_a_samples_dots_do_not_depend_on_its_batch_or_the_chunking(shape, monkeypatch):
    a, signed, absolute = rows_and_columns(*shape)
    whole = rounding.dots(a, signed, absolute)
    for lo, hi in ((0, 1), (3, 4), (0, 2), (1, 4), (shape[0] - 3, shape[0])):  # alone, too
        part = rounding.dots(a[lo:hi], signed[lo:hi], absolute[lo:hi])
        assert torch.equal(part[0], whole[0][lo:hi]) and torch.equal(part[1], whole[1][lo:hi])
    monkeypatch.setattr(rounding, "CHUNK", 3 * shape[1] * shape[2] + 5)  # chunks of 3 samples
    chunked = rounding.dots(a, signed, absolute)
    assert torch.equal(chunked[0], whole[0]) and torch.equal(chunked[1], whole[1])


@pytest.mark.parametrize("shape", [(6, 4, 50), (2, 16, 72)])
def test_the_float64_error_bound_covers_the_batched_sums(shape):
    """Exact rational sums: the signed dot within ``gamma(n, U64)`` of the sum of absolute
    products (Higham's bound, any order), the absolute one at most ``_float64_error`` of
    the computed one, on rows over 12 orders of magnitude."""
    a, signed, absolute = rows_and_columns(*shape, seed=3)
    got_s, got_a = rounding.dots(a, signed, absolute)
    n = shape[2]
    for i in range(shape[0]):
        for r in range(shape[1]):
            terms = [Fraction(float(x)) for x in a[i, r]]
            exact = sum(t * Fraction(float(s)) for t, s in zip(terms, signed[i, :, 0], strict=True))
            size = sum(
                abs(t * Fraction(float(s))) for t, s in zip(terms, signed[i, :, 0], strict=True)
            )
            slack = Fraction(rounding.gamma(n, rounding.U64)) * size
            assert abs(Fraction(float(got_s[i, r, 0])) - exact) <= slack
            for m in range(2):
                true = sum(
                    abs(t) * Fraction(float(v))
                    for t, v in zip(terms, absolute[i, :, m], strict=True)
                )
                bound = rounding._float64_error(got_a[i, r, m], n)
                assert true <= Fraction(float(bound))


def test_crowns_cropped_float32_boxes_contain_sampled_values(monkeypatch):
    """The cropped float32 passes (many short rows per sample: the batched sums) give boxes
    that contain sampled values, and equal those of one product per sample to rounding."""
    monkeypatch.setattr(receptive, "SHARE", float("inf"))  # crop the 10x10 image's fields
    graph = build_graph(resnet(0, False), (3, 10, 10), "resnet0")
    x = torch.rand(2, 3, 10, 10, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    lower, upper = (x - 0.03).clamp(0, 1), (x + 0.03).clamp(0, 1)
    shapes = []
    batched = rounding._batched_dots
    record = lambda rows, *x: shapes.append(rows.shape) or batched(rows, *x)  # noqa: E731
    monkeypatch.setattr(rounding, "_batched_dots", record)
    with torch.no_grad(), rounding.pass_precision("float32"):
        boxes = b.linear_boxes(graph, lower, upper)
        assert any(
            k > 1 and samples > 1 for samples, k, _ in shapes
        )  # several rows, several samples
        monkeypatch.setattr(rounding, "BATCHED_ROWS", 0)  # one product per sample
        looped = b.linear_boxes(graph, lower, upper)
    for (lo, hi), (lo1, hi1) in zip(boxes, looped, strict=True):
        assert torch.allclose(lo, lo1, rtol=0, atol=1e-9) and torch.allclose(
            hi, hi1, rtol=0, atol=1e-9
        )
    u = torch.rand(200, *x.shape, generator=torch.Generator().manual_seed(6), dtype=x.dtype)
    for point in lower + (upper - lower) * u:
        for value, (lo, hi) in zip(node_values(graph, point), boxes, strict=True):
            assert (value >= lo).all() and (value <= hi).all()
