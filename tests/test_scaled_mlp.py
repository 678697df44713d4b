"""``scaled_mlp`` builds the nets the tests and benches share: ``sshape_net`` checked against
the same net written out layer by layer (the tests' former copy), weights bit for bit."""

from __future__ import annotations

import torch
from torch import nn

from aisafety.database.scaled_mlp import scaled_mlp, sshape_net


def _written_out() -> nn.Module:
    torch.manual_seed(5)
    net = nn.Sequential(
        nn.Flatten(), nn.Linear(16, 20), nn.Sigmoid(), nn.Linear(20, 20), nn.Tanh(),
        nn.Linear(20, 12), nn.Sigmoid(), nn.Linear(12, 3),
    )  # fmt: skip
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(4)
    return net


def test_scaled_mlp_is_the_net_written_out():
    ours = sshape_net()  # the named net the tests and benches build
    want = _written_out()
    assert [type(m) for m in ours] == [type(m) for m in want]
    assert ours.state_dict().keys() == want.state_dict().keys()
    assert all(torch.equal(ours.state_dict()[k], v) for k, v in want.state_dict().items())
    assert not ours.training


def test_a_last_layer_without_activation_and_the_seed_matters():
    net = scaled_mlp(0, 1.0, [4, 3, 2], [nn.ReLU])
    assert [type(m) for m in net] == [nn.Flatten, nn.Linear, nn.ReLU, nn.Linear]
    other = scaled_mlp(1, 1.0, [4, 3, 2], [nn.ReLU])
    assert not torch.equal(net[1].weight, other[1].weight)
    doubled = scaled_mlp(0, 2.0, [4, 3, 2], [nn.ReLU])
    assert torch.equal(doubled[3].bias, 2 * net[3].bias)
