"""A user's model is stored and reported under a name of its own, never silently under the
zoo's default ``mnist-cnn``: through the plan, ``aisafety.evaluate`` and the CLI, with
``--resume`` and the release gate's reuse of runs stored under the old default. Two models
of one plan never share a name unless they are one model (derived names take a parent
folder; given ones are refused), and the TorchScript one-image warning names the file."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from batch_as_constant import BatchAsConstant
from torch import nn

import aisafety
from aisafety.check import evaluated_run
from aisafety.cli import main
from aisafety.config import apply_overrides, plan_from_dict
from aisafety.database.datasets.embedded import EmbeddedMnist
from aisafety.errors import AISafetyWarning, ConfigError
from aisafety.interfaces import ModelSpec
from aisafety.loading import load_model
from aisafety.prediction.torch_module import TorchPredictor
from aisafety.store.results import ResultStore

SHAPE = [1, 28, 28]


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    """A TorchScript file ``m.pt``: a zero linear layer, so it always answers class 0 (at
    chance: the clean pass warns, naming the model)."""
    net = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    nn.init.zeros_(net[1].weight), nn.init.zeros_(net[1].bias)
    path = tmp_path_factory.mktemp("own") / "m.pt"
    torch.jit.trace(net.eval(), torch.zeros(1, *SHAPE)).save(str(path))
    return path


def own_plan(path, **model) -> dict:
    spec = {"source": "torchscript", "path": str(path), "input_shape": SHAPE, **model}
    return {"model": spec, "dataset": {"name": "mnist-embedded", "limit": 30},
            "metrics": ["ca"], "device": "cpu"}  # fmt: skip


def stored_names(db: str, run_id: int) -> tuple[str, list[str]]:
    """The model name in run ``run_id``'s stored plan, and the models its values belong to."""
    store = ResultStore(db)
    plan = store.query(f"SELECT json_extract(plan, '$.model.name') FROM runs WHERE id={run_id}")
    models = store.query(
        "SELECT DISTINCT m.name FROM metric_values v JOIN models m ON m.id = v.model_id "
        f"WHERE v.run_id = {run_id}"
    )
    return plan[1][0][0], [row[0] for row in models[1]]


@pytest.mark.parametrize(
    ("model", "name"),
    [
        ({"source": "torchscript", "path": "/tmp/m.pt", "input_shape": [3, 32, 32]}, "m"),
        ({"source": "export", "path": "nets/resnet18.pt2", "input_shape": SHAPE}, "resnet18"),
        ({"source": "onnx", "path": "cifar-net.onnx"}, "cifar-net"),
        ({"source": "checkpoint", "path": "runs/ep50.pt", "architecture": "mnist-cnn"}, "ep50"),
        ({"source": "python", "factory": "mynets:TinyResNet", "input_shape": SHAPE},
         "TinyResNet"),
        ({"source": "python", "factory": "mynets:TinyResNet", "path": "w/ep50.pt",
          "input_shape": SHAPE}, "ep50"),
        ({"source": "onnx", "path": "net.onnx", "name": "mine"}, "mine"),
        ({"source": "zoo"}, "mnist-cnn"),
        ({}, "mnist-cnn"),
    ],
)  # fmt: skip
def test_a_users_file_or_code_is_named_after_it_in_the_stored_plan(model, name):
    plan = plan_from_dict({"model": model})
    assert plan.model.name == name
    assert plan.model_dump(mode="json")["model"]["name"] == name  # what runs.plan stores


@pytest.mark.parametrize(
    ("model", "meaning"),
    [
        ({"source": "remote", "url": "http://10.0.0.5:8000"}, "the served model's name"),
        ({"source": "robustbench", "model_dir": "models", "dataset": "cifar10",
          "threat_model": "Linf"}, "the network's name in RobustBench"),
    ],
)  # fmt: skip
def test_a_model_whose_name_says_what_to_load_needs_one(model, meaning):
    """Before: a remote plan asked the server for /v2/models/mnist-cnn, RobustBench for an
    entry 'mnist-cnn', silently."""
    with pytest.raises(ConfigError, match=f"needs 'name' \\(name: {meaning}"):
        plan_from_dict({"model": model})
    assert plan_from_dict({"model": {**model, "name": "net"}}).model.name == "net"


def test_evaluate_stores_and_warns_under_the_files_name(tmp_path, script):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    with pytest.warns(AISafetyWarning, match="model 'm' has clean accuracy"):
        record = aisafety.evaluate(own_plan(script), db=db)
    assert record.plan.model.name == "m"
    assert stored_names(db, record.run_id) == ("m", ["m"])
    warned = [message for *_, message in ResultStore(db).run_warnings(record.run_id)]
    assert warned and all("'mnist-cnn'" not in message for message in warned)
    given = TorchPredictor(torch.jit.load(str(script)), SHAPE, 10, name="lab-net")
    record = aisafety.evaluate(own_plan(script), db=db, model=given)  # a Predictor's own name
    assert stored_names(db, record.run_id) == ("lab-net", ["lab-net"])


def test_resume_takes_units_stored_under_the_old_default(tmp_path, script):
    """A run stored before the name was the file's (``name: mnist-cnn`` in its plan): the
    units' keys hash the weights, not the name, so ``--resume`` still takes them (the same
    computation), and the new run is stored under the file's name."""
    db = f"sqlite:///{tmp_path / 'r.db'}"
    with pytest.warns(AISafetyWarning):
        old = aisafety.evaluate(own_plan(script, name="mnist-cnn"), db=db)
        new = aisafety.evaluate(own_plan(script), db=db, resume=True)
    assert new.resumed_units == 1 and new.values == old.values
    assert stored_names(db, new.run_id)[0] == "m"


def test_the_gate_reuses_no_run_stored_under_another_name(tmp_path, script):
    """``aisafety check`` reuses a stored run of the same units only where it names the model
    as the plan does: a run of the file stored as 'mnist-cnn' would head the gate's output
    and report with the zoo's name."""
    db = f"sqlite:///{tmp_path / 'r.db'}"
    store = ResultStore(db)
    with pytest.warns(AISafetyWarning):
        old = aisafety.evaluate(own_plan(script, name="mnist-cnn"), db=db)
        named = plan_from_dict(own_plan(script, name="mnist-cnn"))
        assert evaluated_run(named, store, True) == (old.run_id, True)
        fresh, reused = evaluated_run(plan_from_dict(own_plan(script)), store, quiet=True)
    assert (fresh != old.run_id, reused) == (True, False)
    assert stored_names(db, fresh) == ("m", ["m"])
    assert evaluated_run(plan_from_dict(own_plan(script)), store, True) == (fresh, True)


def test_cli_names_the_file_and_model_override_names_the_zoo_model(tmp_path, script, capsys):
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        f"model: {{source: torchscript, path: {script}, input_shape: {SHAPE}}}\n"
        "dataset: {name: mnist-embedded, limit: 10}\nmetrics: [ca]\ndevice: cpu\n"
    )
    db = f"sqlite:///{tmp_path / 'r.db'}"
    assert main(["evaluate", str(plan), "--db", db, "--quiet"]) == 0
    assert "model m on mnist-embedded" in capsys.readouterr().out
    assert main(["evaluate", str(plan), "--db", db, "--quiet", "--model", "mnist-cnn"]) == 0
    assert "model mnist-cnn on mnist-embedded" in capsys.readouterr().out
    assert stored_names(db, 1) == ("m", ["m"]) and stored_names(db, 2)[0] == "mnist-cnn"


def ts(path: str, **model) -> dict:
    return {"source": "torchscript", "path": path, "input_shape": SHAPE, **model}


def factory(name: str, **model) -> dict:
    return {"source": "python", "factory": name, "input_shape": SHAPE, **model}


@pytest.mark.parametrize(
    ("model", "reference", "names"),
    [
        (ts("/r/runs/a/model.pt"), ts("/r/runs/b/model.pt"), ("a/model", "b/model")),
        (ts("/ck/run1/best.pt"), ts("/ck/run2/best.pt"), ("run1/best", "run2/best")),
        (ts("/x/a/model.pt"), ts("/y/a/model.pt"), ("x/a/model", "y/a/model")),
        (ts("/r/a/model.pt"), ts("/r/a/model.pt"), ("model", "model")),  # one model
        (ts("/r/a/model.pt"), ts("/r/b/net.pt"), ("model", "net")),
        ({"source": "checkpoint", "path": "/ck/mnist-cnn.pt", "architecture": "mnist-cnn"},
         {"name": "mnist-cnn"}, ("ck/mnist-cnn", "mnist-cnn")),  # a given name wins
        (ts("/r/a/model.pt", name="model"), ts("/r/b/model.pt"), ("model", "b/model")),
        (ts("/r/a/model.pt", name="a/model"), ts("/r/b/model.pt"), ("a/model", "model")),
        (factory("nets.v1:Net"), factory("nets.v2:Net"), ("v1:Net", "v2:Net")),
    ],
)  # fmt: skip
def test_derived_names_that_clash_in_a_plan_take_a_parent_folder(model, reference, names):
    """Before: both were named after the stem ('model'), so the stored run, the warnings,
    the report and comparisons showed two different networks under one name."""
    plan = plan_from_dict({"model": model, "reference_model": reference})
    assert (plan.model.name, plan.reference_model.name) == names
    stored = plan.model_dump(mode="json")  # what runs.plan stores
    assert (stored["model"]["name"], stored["reference_model"]["name"]) == names
    assert apply_overrides(plan, "cpu", 5).reference_model.name == names[1]  # derived again


def test_a_derived_name_is_lengthened_only_while_it_clashes():
    """``--model`` replaces the model: the reference's name is derived afresh, as is the
    reference's beside a model given in memory (``aisafety.evaluate(model=...)``)."""
    plan = plan_from_dict({"model": ts("/r/a/model.pt"), "reference_model": ts("/r/b/model.pt")})
    assert "name" not in plan.reference_model.model_fields_set  # derived, not given
    zoo = apply_overrides(plan, "cpu", None, model="mnist-cnn")
    assert (zoo.model.name, zoo.reference_model.name) == ("mnist-cnn", "model")
    again = apply_overrides(zoo, "cpu", None, model="model")  # a zoo name the stem has
    assert again.reference_model.name == "b/model"


@pytest.mark.parametrize(
    ("model", "reference", "message"),
    [
        (ts("/r/a/model.pt", name="net"), ts("/r/b/model.pt", name="net"),
         "model and reference_model are both named 'net' but are different models (model: "
         "torchscript '/r/a/model.pt'; reference_model: torchscript '/r/b/model.pt'): the "
         "stored run, the report and comparisons could not tell them apart; give one of them "
         "another name"),
        ({"name": "mnist-cnn"}, ts("/r/b/model.pt", name="mnist-cnn"),
         "both named 'mnist-cnn' but are different models (model: zoo model 'mnist-cnn'; "
         "reference_model: torchscript '/r/b/model.pt')"),
        (ts("/r/a/model.pt", mean=[0.5]), ts("/r/a/model.pt"),
         "would share the name 'model' (model: torchscript '/r/a/model.pt'; reference_model: "
         "torchscript '/r/a/model.pt'; they differ in mean), and no parent folder (or module) "
         "tells them apart: give model or reference_model a name of its own"),
        (factory("nets:Net"), factory("nets:Net", kwargs={"width": 2}),
         "they differ in kwargs"),
        (ts("/model.pt"), {"name": "model"},
         "give model a name of its own"),  # no folder to add
    ],
)  # fmt: skip
def test_different_models_under_one_name_are_refused_naming_both(model, reference, message):
    with pytest.raises(ConfigError) as caught:
        plan_from_dict({"model": model, "reference_model": reference})
    assert message in str(caught.value)


def test_a_plan_giving_two_models_one_name_fails_before_any_work(tmp_path, script, capsys):
    """Exit 2, the message and no traceback; no run is stored (the database is not made)."""
    plan = tmp_path / "plan.yaml"
    spec = f"{{source: torchscript, path: {script}, input_shape: {SHAPE}, name: net}}"
    plan.write_text(f"model: {spec}\nreference_model: {{name: net}}\nmetrics: [ca]\n")
    db = tmp_path / "r.db"
    assert main(["evaluate", str(plan), "--db", f"sqlite:///{db}", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "model and reference_model are both named 'net'" in err and "Traceback" not in err
    assert not db.exists()


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """``runs/a/model.pt`` and ``runs/b/model.pt``: two different TorchScript nets of one
    file name beside a plan naming neither (the model and its reference)."""
    root = tmp_path_factory.mktemp("two")
    for folder, seed in (("a", 0), ("b", 1)):
        torch.manual_seed(seed)
        net = nn.Sequential(nn.Flatten(), nn.Linear(784, 10)).eval()
        (root / "runs" / folder).mkdir(parents=True)
        torch.jit.trace(net, torch.zeros(1, *SHAPE)).save(str(root / "runs" / folder / "model.pt"))
    (root / "plan.yaml").write_text(
        f"model: {{source: torchscript, path: runs/a/model.pt, input_shape: {SHAPE}}}\n"
        f"reference_model: {{source: torchscript, path: runs/b/model.pt, input_shape: {SHAPE}}}\n"
        "dataset: {name: mnist-embedded, limit: 10}\nmetrics: [ca, cav]\ndevice: cpu\n"
    )
    return root


def test_resume_derives_the_same_names_from_any_working_directory(tmp_path, two_runs,
                                                                   monkeypatch):  # fmt: skip
    db = f"sqlite:///{tmp_path / 'r.db'}"
    first = aisafety.evaluate(two_runs / "plan.yaml", db=db, quiet=True)
    monkeypatch.chdir(tmp_path)  # the plan's paths are relative to its folder
    resumed = aisafety.evaluate(two_runs / "plan.yaml", db=db, quiet=True, resume=True)
    assert resumed.resumed_units >= 1 and resumed.values == first.values
    assert stored_names(db, first.run_id) == ("a/model", ["a/model"])
    store = ResultStore(db)
    (cav,) = store.query(f"SELECT details FROM metric_values WHERE run_id = {first.run_id} "
                         "AND metric = 'cav'")[1]  # fmt: skip
    assert json.loads(cav[0])["reference"] == "b/model"
    for record in (first, resumed):  # the resumed run's values are the first run's rows
        names = store.query(
            "SELECT json_extract(plan, '$.model.name'), json_extract(plan, "
            f"'$.reference_model.name') FROM runs WHERE id = {record.run_id}"
        )
        assert names[1] == [("a/model", "b/model")]


def test_a_reference_sharing_the_in_memory_models_name_is_lengthened(tmp_path, monkeypatch):
    """``aisafety.evaluate(model=Net())`` is named ``Net`` (its class); a reference built by
    ``tinynets:Net`` would be too."""
    (tmp_path / "tinynets.py").write_text(
        "from torch import nn\n\n\nclass Net(nn.Sequential):\n"
        "    def __init__(self):\n        super().__init__(nn.Flatten(), nn.Linear(784, 10))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from tinynets import Net

    plan = {"reference_model": factory("tinynets:Net", python_path=[str(tmp_path)]),
            "metrics": ["ca", "cav"], "device": "cpu"}  # fmt: skip
    assert plan_from_dict(plan).reference_model.name == "Net"
    db = f"sqlite:///{tmp_path / 'r.db'}"
    data = EmbeddedMnist().load(None, "test")
    arrays = (data.x[:10].numpy(), data.y[:10].numpy())
    record = aisafety.evaluate(plan, db=db, model=Net(), data=arrays, quiet=True)
    assert (record.plan.model.name, record.plan.reference_model.name) == ("Net", "tinynets:Net")
    assert stored_names(db, record.run_id) == ("Net", ["Net"])


def test_the_torchscript_one_image_warning_names_the_plans_file(tmp_path):
    """The loader reads the file once and hands the archive over as bytes: the warning said
    'the TorchScript archive', naming no file."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # the constant, as intended
        traced = torch.jit.trace(BatchAsConstant().eval(), torch.rand(1, *SHAPE))
    path = tmp_path / "runs" / "traced.pt"
    path.parent.mkdir()
    torch.jit.save(traced, str(path))
    spec = ModelSpec(source="torchscript", path=path, input_shape=SHAPE)
    with pytest.warns(AISafetyWarning, match="runs on one image but not on two") as caught:
        load_model(spec, torch.device("cpu"))
    (message,) = [str(w.message) for w in caught if "one image" in str(w.message)]
    assert f"model 'traced': TorchScript archive {str(path)!r} runs on one image" in message
