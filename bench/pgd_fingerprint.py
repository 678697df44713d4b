"""Hashes of what the training PGD and the PGD attack produce, to diff across two trees.

Training's PGD (``defense/adversarial_training.py``) runs on the attack's ``linf_pgd``
(#37). Run on the tree before and after such a change and diff the outputs: identical
hashes (adversarial examples, PGD-AT and TRADES losses and parameter gradients on the zoo
CNN and a ReLU MLP, PGDLinf with and without random start, early stop, targets) mean the zoo
recipes and stored attack values did not move.

    PYTHONPATH=/path/to/tree OMP_NUM_THREADS=1 python3 bench/pgd_fingerprint.py
"""

import copy
import hashlib

import torch

from aisafety.attack.pgd import PGDLinf
from aisafety.database.datasets.embedded import EmbeddedMnist
from aisafety.database.zoo import load_zoo_model
from aisafety.defense.adversarial_training import pgd_examples
from aisafety.defense.training.base import TrainingStep
from aisafety.plugins import default_registry

torch.set_num_threads(1)


def h(t):
    return hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()[:16]


data = EmbeddedMnist().load(None, "test").balanced_subset(64, seed=0)
x, y = data.x, data.y
predictor = load_zoo_model("mnist-cnn")
cnn = copy.deepcopy(
    predictor.module if hasattr(predictor, "module") else predictor.network
).requires_grad_(True)
torch.manual_seed(0)
mlp = torch.nn.Sequential(
    torch.nn.Flatten(), torch.nn.Linear(784, 50), torch.nn.ReLU(), torch.nn.Linear(50, 10)
)
out = {}
for name, net in (("cnn", cnn), ("mlp", mlp)):
    for rs in (True, False):
        g = torch.Generator().manual_seed(0)
        out[f"pgd_examples {name} random_start={rs}"] = h(
            pgd_examples(net, x, y, 0.3, 10, 0.05, g, rs)
        )
reg = default_registry()
for defense in ("pgd-at", "trades"):
    d = reg.create("training_defense", defense, {})
    for name, net in (("cnn", cnn), ("mlp", mlp)):
        net.zero_grad()
        loss = d.loss(net, x, y, TrainingStep(1.5, 2, torch.Generator().manual_seed(0)))
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in net.parameters()])
        out[f"{defense} loss+grads {name}"] = f"{h(loss.reshape(1))} {h(grads)}"
    if hasattr(d, "selection_score"):
        out[f"{defense} selection_score mlp"] = repr(d.selection_score(mlp, data, 0))
for cfg in ({"steps": 10}, {"steps": 10, "random_start": False}, {"steps": 10, "early_stop": True}):
    r = PGDLinf(**cfg)(predictor, x, y, 0.1)
    out[f"PGDLinf {cfg}"] = f"{h(r.x_adv)} steps={h(r.steps)}"
r = PGDLinf(steps=10)(predictor, x, y, 0.1, target=(y + 1) % 10)
out["PGDLinf targeted"] = f"{h(r.x_adv)} steps={h(r.steps)}"
for k, v in out.items():
    print(f"{k}: {v}")
