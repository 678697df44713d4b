"""The host-side bookkeeping of Square's random search (aisafety/attack/score_search.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aisafety.attack.score_search import ScoreSearch
from aisafety.attack.square import SquareLinf
from aisafety.attack.square_l2 import SquareL2
from aisafety.errors import ModelOutputError
from aisafety.prediction.torch_module import TorchPredictor


class NanAfter(nn.Module):
    """A linear model whose scores turn NaN after ``calls`` forward passes."""

    def __init__(self, calls: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear, self.calls = nn.Linear(3 * 8 * 8, 4), calls

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls -= 1
        scores = self.linear(x.flatten(1))
        return scores if self.calls >= 0 else scores * float("nan")


def _predictor(calls: int) -> TorchPredictor:
    return TorchPredictor(NanAfter(calls), (3, 8, 8), 4, name="nan-later")


def test_update_keeps_only_improvements_and_counts_each_query():
    predictor = _predictor(10**6)
    x = torch.rand((4, 3, 8, 8), generator=torch.Generator().manual_seed(0))
    y = predictor.predict(x)
    search = ScoreSearch(predictor, y, x)
    start = search.margin.clone()
    rows, active = search.active()
    assert list(rows) == [0, 1, 2, 3]  # every sample is classified as y: margin > 0
    proposal = x[active] + 0.5
    new = search.query(proposal, active)
    search.update(rows[:2], active[:2], proposal[:2], x[:2], new[:2])
    for i in range(2):
        better = bool(new[i] < start[i])
        assert torch.equal(search.best[i], proposal[i] if better else x[i])
        assert search.margin[i] == min(float(new[i]), float(start[i]))
    assert torch.equal(search.best[2:], x[2:]) and torch.equal(search.margin[2:], start[2:])
    best, used = search.finish()
    assert used.tolist() == [2, 2, 1, 1]


@pytest.mark.parametrize("attack", [SquareLinf, SquareL2])
def test_a_nan_score_in_the_search_is_refused_naming_the_model(attack):
    """The scores of every query are checked, after the search: a model that turns NaN on
    a later query stops the attack with the model's name, never a silent best point."""
    x = torch.rand((6, 3, 8, 8), generator=torch.Generator().manual_seed(1))
    labels = _predictor(10**6).predict(x)
    predictor = _predictor(3)  # the clean pass, the first query, one more: then NaN
    refused = "nan-later.*NaN or infinite scores for a query of a score-based"
    with pytest.raises(ModelOutputError, match=refused):
        attack(queries=20, seed=0)(predictor, x, labels, 0.05 if attack is SquareLinf else 0.5)


def test_a_row_fooled_already_is_left_as_it_is_and_its_query_not_counted():
    """On a GPU the host learns a query late which rows were fooled, so it may propose for
    one of them again: that proposal must change nothing (the result equals the CPU's)."""
    predictor = _predictor(10**6)
    x = torch.rand((3, 3, 8, 8), generator=torch.Generator().manual_seed(2))
    y = predictor.predict(x)
    search = ScoreSearch(predictor, y, x)
    search.margin[1] = -0.25  # fooled by an earlier query
    search.flags.push(search.margin > 0)
    rows, active = search.active()
    assert list(rows) == [0, 2]  # on the CPU the flags are exact...
    stale_rows, stale = torch.arange(3).numpy(), torch.arange(3)  # ...a GPU may see all three
    proposal = x + 0.25
    new = torch.full((3,), -10.0)  # every proposal would be an improvement
    search.update(stale_rows, stale, proposal, x, new)
    assert float(search.margin[1]) == -0.25 and torch.equal(search.best[1], x[1])
    assert torch.equal(search.best[0], proposal[0]) and torch.equal(search.best[2], proposal[2])
    assert search.finish()[1].tolist() == [2, 1, 2]


def test_writing_back_windows_keeps_the_points_of_whole_images():
    """Square's device path writes back only each proposal's window (``update_windows``):
    the same best points, margins and counts as ``update`` with whole images, a stale row
    (fooled by an earlier query) left as it is."""
    predictor = _predictor(10**6)
    x = torch.rand((3, 3, 8, 8), generator=torch.Generator().manual_seed(3))
    y = predictor.predict(x)
    whole, windows = ScoreSearch(predictor, y, x.clone()), ScoreSearch(predictor, y, x.clone())
    for search in (whole, windows):
        search.margin[1] = -0.25
    rows, active = torch.arange(3).numpy(), torch.arange(3)
    flat = torch.tensor([[0, 5, 70, 191], [1, 2, 3, 4], [64, 100, 128, 190]])
    window = torch.rand((3, 4), generator=torch.Generator().manual_seed(4))
    proposal = x.clone().view(3, -1).scatter(1, flat, window).view_as(x)
    new = torch.tensor([-1.0, -2.0, float(whole.margin[2]) + 1])  # 0 improves, 2 does not
    whole.update(rows, active, proposal, x.clone(), new)
    before = x.reshape(3, -1).gather(1, flat)
    windows.update_windows(rows, active, flat, window, before, new)
    assert torch.equal(whole.best, windows.best) and torch.equal(whole.margin, windows.margin)
    assert torch.equal(whole.best[0], proposal[0]) and torch.equal(whole.best[1:], x[1:])
    assert torch.equal(whole.finish()[1], windows.finish()[1])
