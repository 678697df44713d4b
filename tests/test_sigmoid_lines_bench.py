"""bench/sigmoid_lines.py --test-nets measures the tests' sigmoid/tanh nets, which it
rebuilds itself (a bench does not import tests): the same layers and the same weights."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from tests.test_contract import _smooth_net
from tests.test_sshape_relaxation import sshape_net

sys.path.append(str(Path(__file__).resolve().parents[1] / "bench"))
import sigmoid_lines  # noqa: E402


def test_the_bench_builds_the_tests_nets():
    ours = sigmoid_lines.small_nets()
    for name, theirs in (("sshape_net", sshape_net()), ("contract _smooth_net", _smooth_net())):
        net = ours[name]
        assert [type(m) for m in net] == [type(m) for m in theirs]
        mine, want = net.state_dict(), theirs.state_dict()
        assert mine.keys() == want.keys()
        assert all(torch.equal(mine[k], want[k]) for k in want)
