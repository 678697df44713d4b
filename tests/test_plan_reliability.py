"""Every malformed plan, model file, dataset file or plugin gives a clear error naming the
field, the value and the fix: no traceback, no runaway, no silent acceptance."""

from __future__ import annotations

import gzip
import math
import time
from types import SimpleNamespace

import pytest
import torch

from aisafety.cli import main
from aisafety.config import load_plan, plan_from_dict
from aisafety.database.datasets.idx import read_idx
from aisafety.errors import ConfigError, ModelOutputError
from aisafety.hookspecs import hookimpl
from aisafety.interfaces import AttackSpec, EvaluationPlan, ModelSpec, Norm, WorkLimits
from aisafety.limits import check_budgets, check_work_limits
from aisafety.loading import load_model
from aisafety.plugins import build_registry
from aisafety.prediction.torch_module import TorchPredictor
from aisafety.runner import Runner
from aisafety.store.results import ResultStore


def _write(tmp_path, name: str, content: str | bytes):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


# --- YAML / TOML reading ------------------------------------------------------------------


def test_yaml_numbers_follow_yaml_1_2(tmp_path):
    plan = load_plan(_write(tmp_path, "p.yaml", "attacks: [{name: fgsm, eps: 1e-3}]\nseed: 017"))
    assert plan.attacks[0].eps == (0.001,) and plan.seed == 17


def test_duplicate_yaml_keys_are_an_error(tmp_path):
    with pytest.raises(ConfigError, match="found the key 'eps' twice"):
        load_plan(_write(tmp_path, "p.yaml", "attacks:\n- name: fgsm\n  eps: 0.1\n  eps: 0.3\n"))


def test_alias_bomb_fails_fast_with_a_small_message(tmp_path):
    lines, previous = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]'], "a"
    for name in "bcdefghi":
        lines.append(f"{name}: &{name} [{', '.join(['*' + previous] * 9)}]")
        previous = name
    started = time.perf_counter()
    with pytest.raises(ConfigError, match="expands") as caught:
        load_plan(_write(tmp_path, "bomb.yaml", "\n".join(lines)))
    spent = time.perf_counter() - started  # expanding the bomb would take hours and 1e9 nodes
    assert spent < 120, f"the alias bomb took {spent:.0f} s to refuse"
    assert len(str(caught.value)) < 1000


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.toml", "", "is empty"),
        ("empty.yaml", "{}", "is empty"),
        ("latin1.yaml", "model: {name: \xe9}".encode("latin-1"), "not UTF-8"),
        ("binary.yaml", b"\x89PNG\r\n\x1a\n\x00\x00", "binary"),
        ("list.yaml", "- fgsm", "mapping"),
        ("bad.toml", "a = = 1", "cannot be parsed"),
        ("huge-int.yaml", "seed: " + "9" * 5000, "cannot be read|seed"),
        ("int-keys.yaml", "1: 2", "valid evaluation plan"),
    ],
)
def test_unreadable_plans_are_clear_errors(tmp_path, name, content, message):
    with pytest.raises(ConfigError, match=message):
        load_plan(_write(tmp_path, name, content))


# --- field validation --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"seed": 2**63}, "seed"),
        ({"seed": -1}, "seed"),
        ({"dataset": {"seed": 2**64}}, "dataset.seed"),
        ({"dataset": {"limit": 0}}, "dataset.limit"),
        ({"attacks": [{"name": "fgsm", "eps": math.inf}]}, "attacks.0.eps"),
        ({"attacks": [{"name": "fgsm", "eps": True}]}, "attacks.0.eps"),
        ({"attacks": [{"name": "fgsm", "eps": "0.1"}]}, "attacks.0.eps"),
        ({"attacks": [{"name": "fgsm", "eps": [0.1, math.nan]}]}, "attacks.0.eps"),
        ({"model": {"name": "mnist-cnn", "std": [0.0]}}, "model.std"),
        ({"model": {"name": "mnist-cnn", "mean": [0.5]}}, "mean is not used by a zoo"),
        ({"model": {"source": "zoo", "input_shape": [1, 28, 28]}}, "input_shape is not used"),
        ({"model": {"source": "remote", "url": "http://x", "mean": [0.1]}}, "not used by a remote"),
        ({"model": {"source": "onnx", "path": "m.onnx", "timeout": 5}}, "timeout is not used"),
        ({"model": {"source": "remote", "url": "http://x", "timeout": 0}}, "model.timeout"),
        ({"model": {"source": "remote", "url": "http://x", "retries": 99}}, "model.retries"),
        (
            {
                "model": {
                    "source": "torchscript",
                    "path": "m.pt",
                    "input_shape": [3, 8, 8],
                    "std": [0.1, 0.2],
                }
            },
            "one value per channel",
        ),  # fmt: skip
        ({"limits": {"steps": 0}}, "limits.steps"),
        ({"batch_size": 10**9}, "batch_size"),
    ],
)
def test_bad_fields_name_the_field(raw, field):
    with pytest.raises(ConfigError) as caught:
        plan_from_dict(raw)
    assert field in str(caught.value)


def test_remote_timeout_and_retries_reach_the_predictor(monkeypatch):
    seen = {}

    class FakeRemote:
        def __init__(self, *args, **kwargs):
            seen.update(kwargs)

    monkeypatch.setattr("aisafety.prediction.remote.RemotePredictor", FakeRemote)
    # a remote model names the served model (no default since session 20: it was mnist-cnn)
    spec = ModelSpec(name="net", source="remote", url="http://127.0.0.1:1", timeout=2.5, retries=1)
    load_model(spec, torch.device("cpu"))
    assert seen["timeout"] == 2.5 and seen["retries"] == 1


# --- limits and budgets (checked against the live attack) ----------------------------------


def test_runaway_steps_need_an_explicit_limit():
    spec = AttackSpec(name="pgd-linf", config={"steps": 10**12})
    plan = EvaluationPlan(attacks=(spec,), metrics=())
    with pytest.raises(ConfigError, match=r"steps = 1,000,000,000,000 is above the limit"):
        Runner(plan, store=None)
    raised = plan.model_copy(update={"limits": WorkLimits(steps=10**12)})
    Runner(raised, store=None)  # allowed on purpose
    config = SimpleNamespace(n_restarts=5000, max_queries=10**7, binary_search_steps=3)
    with pytest.raises(ConfigError, match="n_restarts"):
        check_work_limits(spec, vars(config), WorkLimits())


@pytest.mark.parametrize(
    ("norm", "eps", "ok"),
    [(Norm.LINF, 8.0, False), (Norm.LINF, 1.0, True), (Norm.L2, 27.0, True),
     (Norm.L2, 29.0, False), (Norm.L1, 700.0, True), (None, 5.0, True)],
)  # fmt: skip
def test_budgets_beyond_the_largest_distance_are_refused(norm, eps, ok):
    spec = AttackSpec(name="x", eps=eps)
    if ok:
        check_budgets(spec, norm, (1, 28, 28))
    else:
        with pytest.raises(ConfigError, match="largest"):
            check_budgets(spec, norm, (1, 28, 28))


def test_eps_8_on_the_command_line_plan_is_an_error_not_a_run(tmp_path, capsys):
    plan = _write(tmp_path, "p.yaml", "attacks: [{name: fgsm, eps: 8}]\nmetrics: [aaw]\n")
    db = tmp_path / "r.db"
    assert main(["evaluate", str(plan), "--db", f"sqlite:///{db}", "--limit", "10"]) == 2
    err = capsys.readouterr().err
    assert "0-255 scale 8 is 0.03137" in err and "Traceback" not in err


@pytest.mark.parametrize("limit", ["-5", "0"])
def test_cli_limit_is_validated(tmp_path, capsys, limit):
    assert main(["evaluate", "--limit", limit, "--db", f"sqlite:///{tmp_path / 'r.db'}"]) == 2
    assert "dataset.limit" in capsys.readouterr().err


# --- models -----------------------------------------------------------------------------


class _Broken(torch.nn.Module):
    def __init__(self, value: float = math.nan, classes: int = 10):
        super().__init__()
        self.value, self.classes = value, classes

    def forward(self, x):
        out = torch.zeros(len(x), self.classes)
        out[0, 0] = self.value
        return out


@pytest.mark.parametrize(
    ("module", "message"),
    [(_Broken(math.nan), "NaN or infinite"), (_Broken(math.inf), "NaN or infinite"),
     (_Broken(0.0, classes=3), r"shape \(4, 3\)")],
)  # fmt: skip
def test_bad_model_scores_are_an_error_naming_the_model(module, message):
    predictor = TorchPredictor(module, (1, 28, 28), 10, name="broken-net")
    with pytest.raises(ModelOutputError, match=message) as caught:
        predictor.logits(torch.rand(4, 1, 28, 28))
    assert "broken-net" in str(caught.value)


def test_a_model_that_fails_inside_is_an_error_naming_it():
    class FixedBatch(torch.nn.Module):
        def forward(self, x):
            return x.reshape(4, 784)[:, :10]

    predictor = TorchPredictor(FixedBatch(), (1, 28, 28), 10, name="fixed-batch-net")
    with pytest.raises(ModelOutputError, match=r"fixed-batch-net.*failed on a batch of shape"):
        predictor.logits(torch.rand(3, 1, 28, 28))


def test_a_nan_model_stores_nothing(tmp_path, monkeypatch):
    """It used to commit CA 0.1 as a finished unit, then die with an IntegrityError."""
    nan_net = TorchPredictor(_Broken(math.nan), (1, 28, 28), 10, name="nan-net")
    monkeypatch.setattr(
        "aisafety.runner.load_model", lambda spec, device, registry=None: (nan_net, "f" * 64)
    )
    store = ResultStore(f"sqlite:///{tmp_path / 'r.db'}")
    plan = plan_from_dict({"dataset": {"limit": 10}, "metrics": ["ca"], "device": "cpu"})
    with pytest.raises(ModelOutputError, match="nan-net"):
        Runner(plan, store, quiet=True).run()
    assert store.finished_units() == set()
    assert store.query("SELECT status FROM runs")[1] == [("failed",)]


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"not a checkpoint at all", "not a loadable PyTorch checkpoint"),
     (b"", "not a loadable PyTorch checkpoint"),
     (None, "holds a list, not a state dict")],
)  # fmt: skip
def test_unloadable_checkpoints_are_clear_errors(tmp_path, content, message):
    path = tmp_path / "model.pt"
    if content is None:
        torch.save([1, 2, 3], path)
    else:
        path.write_bytes(content)
    spec = ModelSpec(
        name="mine", source="checkpoint", path=path, architecture="mnist-cnn",
        input_shape=(1, 28, 28),
    )  # fmt: skip
    with pytest.raises(ConfigError, match=message):
        load_model(spec, torch.device("cpu"))


# --- dataset files ------------------------------------------------------------------------


def _idx(n: int) -> bytes:
    return (0x803).to_bytes(4, "big") + b"".join(
        d.to_bytes(4, "big") for d in (n, 28, 28)
    ) + bytes(n * 784)  # fmt: skip


def test_truncated_and_junk_idx_files_are_clear_errors(tmp_path):
    good = _write(tmp_path, "ok-idx3-ubyte", _idx(3))
    assert read_idx(good, 0x803).shape == (3, 28, 28)
    truncated = _write(tmp_path, "cut-idx3-ubyte", _idx(3)[:-100])
    with pytest.raises(ConfigError, match="truncated"):
        read_idx(truncated, 0x803)
    junk = _write(tmp_path, "junk-idx3-ubyte.gz", b"this is not gzip data")
    with pytest.raises(ConfigError, match="cannot be read"):
        read_idx(junk, 0x803)
    cut_gz = _write(tmp_path, "cut-idx3-ubyte.gz", gzip.compress(_idx(3))[:-20])
    with pytest.raises(ConfigError, match="cannot be read"):
        read_idx(cut_gz, 0x803)


# --- plugins -------------------------------------------------------------------------------


class _BrokenImportPlugin:
    @staticmethod
    @hookimpl
    def aisafety_attacks():
        raise ImportError("No module named 'missing_dependency'")


def test_a_broken_plugin_is_warned_about_in_evaluate(tmp_path, capsys, monkeypatch):
    registry = build_registry(extra_plugins=[("broken-plugin", _BrokenImportPlugin)])
    monkeypatch.setattr("aisafety.cli.common.default_registry", lambda: registry)
    plan = _write(tmp_path, "p.yaml", "metrics: [ca]\ndevice: cpu\n")
    assert main(["evaluate", str(plan), "--db", f"sqlite:///{tmp_path / 'r.db'}",
                 "--limit", "10", "--quiet"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "warning: plugin 'broken-plugin'" in err and "missing_dependency" in err


class _ClashingPlugin:
    @staticmethod
    @hookimpl
    def aisafety_attacks():
        from aisafety.attack.fgsm import FGSM

        return [type("MyFGSM", (FGSM,), {})]


def test_a_plugin_reusing_a_builtin_name_is_reported_not_fatal(capsys, monkeypatch):
    """It made every command exit 2, 'aisafety plugins' included."""
    registry = build_registry(extra_plugins=[("clashing-plugin", _ClashingPlugin)])
    monkeypatch.setattr("aisafety.cli.common.default_registry", lambda: registry)
    assert main(["plugins"]) == 1  # listed, with the clash reported
    out = capsys.readouterr().out
    assert "clashing-plugin" in out and "'fgsm' is registered twice" in out
    assert main(["list", "attacks"]) == 0
