"""Remote models over the Open Inference Protocol v2, checked from both ends by outsiders.

- A model served by a program in another language (``node_oip_server.js``, plain Node.js)
  evaluated through ``RemotePredictor`` gives the same logits, Square attack and metrics as
  the same model in-process.
- ``aisafety``'s own server answers an independent client (NVIDIA's ``tritonclient``) with
  the in-process logits.
- Transport failures (refused connection, 5xx, 4xx, bad shapes, NaN, timeouts) become clear
  errors naming the URL, and transient ones are retried.
"""

from __future__ import annotations

import json
import math
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import children
import numpy as np
import pytest
import torch
from torch import nn

from aisafety.attack.square import SquareLinf
from aisafety.database.datasets.base import LoadedDataset
from aisafety.database.datasets.embedded import EmbeddedMnist
from aisafety.database.zoo import load_zoo_model
from aisafety.errors import CapabilityError
from aisafety.evaluation.context import EvaluationContext
from aisafety.evaluation.metrics.accuracy import CleanAccuracy
from aisafety.interfaces import AttackSpec, Capability
from aisafety.prediction.remote import (
    RemoteConnectionError,
    RemoteHTTPError,
    RemotePredictor,
    RemoteResponseError,
    RemoteTimeoutError,
)
from aisafety.prediction.server import make_server
from aisafety.prediction.torch_module import TorchPredictor

NODE_SERVER = Path(__file__).with_name("node_oip_server.js")


@pytest.fixture(scope="module")
def embedded() -> LoadedDataset:
    return EmbeddedMnist().load(None, "test")


@pytest.fixture(scope="module")
def zoo() -> TorchPredictor:
    return load_zoo_model("mnist-cnn")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _first_line(process: subprocess.Popen, timeout: float = 600.0) -> str:
    """The first line a child prints, without hanging the suite if it never does."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not lines:
        children.kill_group(process)
        raise RuntimeError(f"{process.args[:2]} printed nothing within {timeout:g} s (hang guard)")
    return lines[0]


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _post(url: str, body: object) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


# -- a model in another language -----------------------------------------------------------


@pytest.fixture(scope="module")
def linear_weights(embedded) -> tuple[torch.Tensor, torch.Tensor]:
    """A least-squares linear MNIST classifier (W: 10x784, b: 10), fitted in closed form."""
    features = torch.cat([embedded.x.flatten(1), torch.ones(len(embedded), 1)], 1).double()
    targets = nn.functional.one_hot(embedded.y, 10).double()
    gram = features.T @ features + torch.eye(features.shape[1], dtype=torch.double)
    solution = torch.linalg.solve(gram, features.T @ targets).float()
    return solution[:784].T.contiguous(), solution[784].contiguous()


@pytest.fixture(scope="module")
def node_server(linear_weights, tmp_path_factory):
    """The Node.js OIP v2 server on a free port; yields its base URL, killed at teardown."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js (`node`) is not installed; the cross-language check needs it")
    weights, bias = linear_weights
    path = tmp_path_factory.mktemp("node") / "weights.json"
    path.write_text(json.dumps({"W": weights.tolist(), "b": bias.tolist()}))
    process = children.start(
        [node, str(NODE_SERVER), "--weights", str(path), "--port", "0", "--name", "linear"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = _first_line(process).split()  # "listening <port>"
        if len(line) != 2 or line[0] != "listening":
            process.kill()
            raise RuntimeError(f"node server did not start: {line} {process.stderr.read()}")
        url = f"http://127.0.0.1:{line[1]}"
        deadline = time.monotonic() + 600  # a hang guard: it polls until ready
        while _get_status(f"{url}/v2/health/ready") != 200:
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError("node server never became ready")
            time.sleep(0.05)
        yield url
    finally:
        children.kill_group(process)
        process.communicate()


def _get_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status
    except (OSError, urllib.error.URLError):
        return 0


def _in_process_linear(weights: torch.Tensor, bias: torch.Tensor) -> TorchPredictor:
    layer = nn.Linear(784, 10)
    with torch.no_grad():
        layer.weight.copy_(weights)
        layer.bias.copy_(bias)
    return TorchPredictor(nn.Sequential(nn.Flatten(), layer), (1, 28, 28), 10, name="linear")


BUDGETS = (0.3, 0.1)  # 0.3 fools the linear model at once; 0.1 takes a real search


def _evaluate(predictor, data: LoadedDataset):
    spec = AttackSpec(name="square-linf", config={"queries": 60, "seed": 7}, eps=BUDGETS)
    ctx = EvaluationContext(predictor, data, lambda s: SquareLinf(s.config), batch_size=8)
    ca = CleanAccuracy().compute(ctx)[0].value
    return ctx.clean_logits, ca, [ctx.adversarial(spec, eps) for eps in BUDGETS]


def test_node_model_evaluates_like_the_same_model_in_process(node_server, linear_weights, embedded):
    data = embedded.balanced_subset(20, seed=5)
    remote = RemotePredictor(node_server, "linear", max_batch_size=8)
    # Everything the predictor needs was read from the Node server's metadata.
    assert remote.input_shape == (1, 28, 28) and remote.num_classes == 10
    assert remote.input_name == "input"
    assert remote.capabilities == {Capability.SCORES, Capability.LABELS}
    local = _in_process_linear(*linear_weights)

    remote_logits, remote_ca, remote_results = _evaluate(remote, data)
    local_logits, local_ca, local_results = _evaluate(local, data)

    assert torch.allclose(remote_logits, local_logits, rtol=1e-5, atol=1e-4)
    assert remote_ca == local_ca and remote_ca >= 0.8
    for eps, ours, theirs in zip(BUDGETS, remote_results, local_results, strict=True):
        # The attack only sees logits, so the same seed takes the same path on both.
        assert torch.equal(ours.steps, theirs.steps), eps
        assert torch.equal(ours.success, theirs.success), eps
        assert torch.equal(ours.x_adv, theirs.x_adv), eps
        assert torch.allclose(ours.adv_logits, theirs.adv_logits, rtol=1e-5, atol=1e-4)
        assert ours.robust_accuracy == theirs.robust_accuracy
        assert ours.robust_accuracy < remote_ca  # Square fools some samples
    searched = remote_results[1]
    assert searched.robust_accuracy > 0 and int(searched.steps.max()) == 60
    assert remote.requests_sent > 60  # at least one request per query of the search


def test_gradient_attack_on_remote_model_is_refused(node_server, embedded):
    from aisafety.attack.pgd import PGDLinf

    remote = RemotePredictor(node_server, "linear")
    with pytest.raises(CapabilityError, match="pgd-linf.*linear@http"):
        PGDLinf(steps=2)(remote, embedded.x[:2], embedded.y[:2], 0.1)


# -- our server, an outside client ----------------------------------------------------------


@pytest.fixture(scope="module")
def served(zoo):
    with make_server(zoo, port=0, model_name="mnist-cnn") as server:
        yield server


def test_tritonclient_talks_to_our_server(served, zoo, embedded):
    http = pytest.importorskip("tritonclient.http", reason="tritonclient[http] not installed")
    client = http.InferenceServerClient(url=served.url.removeprefix("http://"))
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("mnist-cnn")
        meta = client.get_model_metadata("mnist-cnn")
        assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 1, 28, 28]}]
        assert meta["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]
        x = embedded.x[:12]
        with torch.inference_mode():
            expected = zoo.logits(x).numpy()
        for binary in (False, True):  # JSON data, and Triton's binary tensor extension
            tensor = http.InferInput("input", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x.numpy(), binary_data=binary)
            wanted = http.InferRequestedOutput("logits", binary_data=binary)
            answer = client.infer("mnist-cnn", [tensor], outputs=[wanted])
            assert np.array_equal(answer.as_numpy("logits"), expected)
        with pytest.raises(Exception, match="not served here"):
            client.get_model_metadata("other-model")
    finally:
        client.close()


def test_remote_predictor_round_trip_through_our_server(served, zoo, embedded):
    remote = RemotePredictor(served.url, "mnist-cnn", max_batch_size=16)
    x = embedded.x[:40]
    with torch.inference_mode():
        assert torch.equal(remote.logits(x), zoo.logits(x))
    assert remote.requests_sent == 1 + 3  # metadata, then 16 + 16 + 8
    assert remote.ready()


def test_server_rejects_bad_requests_with_json_errors(served):
    infer = f"{served.url}/v2/models/mnist-cnn/infer"
    good = {"name": "input", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": [0.5] * 784}
    status, body = _post(infer, {"inputs": [good]})
    assert status == 200 and body["outputs"][0]["shape"] == [1, 10]
    flat = {**good, "shape": [1, 784]}  # any layout with N first and C*H*W values per sample
    assert _post(infer, {"inputs": [flat]})[0] == 200
    cases = {
        "datatype": ({**good, "datatype": "INT64"}, "FP32"),
        "shape": ({**good, "shape": [1, 3, 28, 28]}, "values per sample"),
        "count": ({**good, "data": [0.5] * 700}, "needs 784 values"),
        "range": ({**good, "data": [2.0] * 784}, r"\[0, 1\]"),
        "name": ({**good, "name": "x"}, "unknown input"),
    }
    for case, (tensor, message) in cases.items():
        status, body = _post(infer, {"inputs": [tensor]})
        assert status == 400, case
        assert __import__("re").search(message, body["error"]), (case, body)
    assert _post(infer, b"{not json")[0] == 400
    assert _post(f"{served.url}/v2/models/other/infer", {"inputs": [good]})[0] == 404
    assert _get(f"{served.url}/v2/nothing")[0] == 404
    assert _get(f"{served.url}/v2/models/mnist-cnn/versions/7")[0] == 404
    assert _get(f"{served.url}/v2/models/mnist-cnn/versions/1/ready") == (
        200,
        {"name": "mnist-cnn", "ready": True},
    )
    assert _get(f"{served.url}/v2/health/live") == (200, {"live": True})
    assert _get(infer)[0] == 405


def test_serve_in_a_separate_process(zoo, embedded):
    """``serve()`` as ``aisafety serve`` runs it: its own process, a free port, Ctrl-C ends it."""
    code = (
        "from aisafety.prediction.server import open_model, serve\n"
        "serve(open_model('mnist-cnn'), '127.0.0.1', 0, 'zoo-cnn', verbose=False)\n"
    )
    process = children.start(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = _first_line(process)
        assert "serving model 'zoo-cnn'" in line, (line, process.stderr.read())
        url = line.strip().split(" at ")[-1].split("/v2/")[0]
        remote = RemotePredictor(url, "zoo-cnn")
        with torch.inference_mode():
            assert torch.equal(remote.logits(embedded.x[:5]), zoo.logits(embedded.x[:5]))
    finally:
        process.terminate()  # SIGTERM ends serve() cleanly; the group is killed if it hangs
        children.communicate(process, what="aisafety serve after SIGTERM", timeout=600)


# -- transport failures ---------------------------------------------------------------------


class _Stub(BaseHTTPRequestHandler):
    """Answers infer requests from a script of (status, body or None = good logits, delay)."""

    server: _StubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        self._answer(200, json.dumps(self.server.metadata).encode())

    def do_POST(self) -> None:  # noqa: N802
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.seen.append(request)
        status, body, delay = self.server.script.pop(0) if self.server.script else (200, None, 0)
        time.sleep(delay)
        if body is None:
            tensor = request["inputs"][0]
            n = tensor["shape"][0]
            values = np.asarray(tensor["data"], np.float32).reshape(n, -1).sum(1)
            logits = values[:, None] * np.arange(10, dtype=np.float32)[None]
            body = {"outputs": [{"name": "y", "shape": [n, 10], "data": logits.ravel().tolist()}]}
        self._answer(status, body if isinstance(body, bytes) else json.dumps(body).encode())

    def _answer(self, status: int, body: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the client gave up (timeout test)
            pass


class _StubServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Stub)
        self.script: list[tuple[int, object, float]] = []
        self.seen: list[dict] = []
        self.metadata = {
            "name": "m",
            "inputs": [{"name": "0", "datatype": "FP32", "shape": [-1, 784]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 10]}],
        }

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def stub():
    server = _StubServer()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _remote(url: str, **kwargs) -> RemotePredictor:
    options = {"retries": 0, "backoff": 0.01, "timeout": 60.0, **kwargs}  # a busy CI machine
    return RemotePredictor(url, "m", (1, 28, 28), **options)


def test_metadata_names_the_input_and_batches_are_split(stub):
    remote = _remote(stub.url, max_batch_size=4)
    assert remote.input_name == "0" and remote.wire_shape == (784,)
    assert remote.num_classes == 10
    x = torch.rand(10, 1, 28, 28)
    logits = remote.logits(x)
    expected = x.flatten(1).sum(1, keepdim=True) * torch.arange(10.0)
    assert torch.allclose(logits, expected, rtol=1e-5)
    assert [r["inputs"][0]["shape"] for r in stub.seen] == [[4, 784], [4, 784], [2, 784]]
    assert {r["inputs"][0]["name"] for r in stub.seen} == {"0"}
    assert {r["inputs"][0]["datatype"] for r in stub.seen} == {"FP32"}


def test_connection_refused_names_the_url():
    url = f"http://127.0.0.1:{_free_port()}"
    remote = RemotePredictor(
        url, "m", (1, 28, 28), 10, input_name="input", retries=1, backoff=0.01
    )  # everything given: no metadata request at construction
    with pytest.raises(RemoteConnectionError) as caught:
        remote.logits(torch.zeros(1, 1, 28, 28))
    message = str(caught.value)
    assert url in message and "connection refused" in message
    assert "check that the server is running" in message and "2 attempts" in message
    with pytest.raises(RemoteConnectionError, match=url):  # metadata lookup fails the same way
        RemotePredictor(url, "m", retries=0)


def test_server_error_is_retried_then_succeeds(stub):
    stub.script = [(500, {"error": "warming up"}, 0), (503, b"busy", 0)]
    remote = _remote(stub.url, retries=2)
    logits = remote.logits(torch.full((3, 1, 28, 28), 0.5))
    assert logits.shape == (3, 10)
    assert len(stub.seen) == 3  # two failures, then the answer


def test_persistent_server_error_and_client_errors_are_clear(stub):
    stub.script = [(500, {"error": "model crashed: CUDA OOM"}, 0)] * 3
    with pytest.raises(RemoteHTTPError) as caught:
        _remote(stub.url, retries=2).logits(torch.zeros(1, 1, 28, 28))
    assert caught.value.status == 500 and "model crashed: CUDA OOM" in str(caught.value)
    assert "HTTP 500" in str(caught.value) and "3 attempts" in str(caught.value)
    assert stub.url in str(caught.value)

    stub.seen.clear()
    stub.script = [(400, {"error": "bad input name"}, 0)]
    with pytest.raises(RemoteHTTPError, match="HTTP 400.*bad input name"):
        _remote(stub.url, retries=3).logits(torch.zeros(1, 1, 28, 28))
    assert len(stub.seen) == 1  # a client error is not retried


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"outputs": [{"name": "y", "shape": [1, 3], "data": [0.0, 1.0, 2.0]}]}, "10 classes"),
        ({"outputs": [{"name": "y", "shape": [2, 10], "data": [0.0] * 20}]}, "batch of 1"),
        ({"outputs": [{"name": "y", "shape": [1, 10], "data": [0.0] * 9}]}, "9 values"),
        ({"outputs": []}, "without outputs"),
        (b'{"outputs": [{"shape": [1, 10], "data": [NaN, 0, 0, 0, 0, 0, 0, 0, 0, 0]}]}', "NaN"),
        ({"outputs": [{"name": "y", "shape": [1, 10], "data": [None] + [0.0] * 9}]}, "NaN"),
        (b"<html>gateway</html>", "not JSON"),
    ],
)
def test_unusable_answers_are_clear_errors(stub, body, message):
    stub.script = [(200, body, 0)]
    with pytest.raises(RemoteResponseError, match=message):
        _remote(stub.url, num_classes=10).logits(torch.zeros(1, 1, 28, 28))


def test_timeout_is_honoured(stub):
    stub.script = [(200, None, 60.0)]  # answers after 60 s: only the timeout ends it sooner
    remote = _remote(stub.url, num_classes=10, timeout=0.3)
    started = time.monotonic()
    with pytest.raises(RemoteTimeoutError, match=r"within 0\.3 s"):
        remote.logits(torch.zeros(1, 1, 28, 28))
    waited = time.monotonic() - started
    assert waited < 30, f"the 0.3 s timeout ended the call only after {waited:.1f} s"
    assert math.isclose(remote.timeout, 0.3)


def test_server_started_twice_still_closes():
    """``with make_server(p).start() as s`` must not leave a second loop that blocks close()."""
    predictor = TorchPredictor(nn.Sequential(nn.Flatten(), nn.Linear(4, 3)), (1, 2, 2), 3)

    def start_twice_and_close() -> None:
        with make_server(predictor, model_name="tiny").start():  # __enter__ starts again
            pass

    worker = threading.Thread(target=start_twice_and_close, daemon=True)
    worker.start()
    worker.join(timeout=300)  # a hang guard: a close() that hangs never returns
    assert not worker.is_alive(), "close() hung after a second start()"
