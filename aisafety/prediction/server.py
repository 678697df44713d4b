"""Serve any predictor over the Open Inference Protocol v2 (REST), as ``aisafety serve`` does.

The endpoints are the OIP v2 subset a client needs to find and run one classifier:

- ``GET  /v2``                          server metadata
- ``GET  /v2/health/live``, ``/v2/health/ready``
- ``GET  /v2/models/{name}``            model metadata: input ``input`` FP32 ``[-1, C, H, W]``,
                                        output ``logits`` FP32 ``[-1, num_classes]``
- ``GET  /v2/models/{name}/ready``
- ``POST /v2/models/{name}/infer``      FP32 input in [0, 1], shape ``[N, C, H, W]`` (or a
                                        shape holding its values in the same order: flat
                                        ``[N, C*H*W]``, ``[N, H, W]`` for one channel; not
                                        channels-last, ``check_sample_shape``); returns
                                        output ``logits`` FP32 ``[N, num_classes]``

(``/versions/1`` may be inserted after the model name.) Tensor data travels as JSON, or in
Triton's binary tensor data extension (``Inference-Header-Content-Length``) for inputs and,
when a client asks with ``"binary_data": true``, for the output. Bad requests get a 400, an
unknown model or path a 404, each as ``{"error": "..."}`` as the protocol specifies.

``make_server`` returns the server object without blocking (port 0 picks a free port), so
tests run it in-process; ``serve`` runs it until interrupted.
"""

from __future__ import annotations

import json
import math
import re
import signal
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aisafety.errors import AISafetyError, ConfigError
from aisafety.prediction.base import Predictor
from aisafety.prediction.remote import same_order
from aisafety.version import __version__

INPUT_NAME = "input"
OUTPUT_NAME = "logits"
MODEL_VERSION = "1"
_MODEL_PATH = re.compile(
    r"^/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?(?P<action>/ready|/infer)?/?$"
)
_BINARY_HEADER = "Inference-Header-Content-Length"


BYTES_PER_NUMBER = 24  # the longest float32 as JSON text with its separator, and a margin
ENVELOPE_BYTES = 1 << 20  # the request's JSON around the numbers
REQUEST_TIMEOUT_S = 60.0  # a client silent for this long is disconnected


class RequestError(Exception):
    """A request the server answers with an error status and a JSON message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class OIPServer(ThreadingHTTPServer):
    """A threading HTTP server holding one predictor under one model name."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        predictor: Predictor,
        model_name: str,
        max_batch_size: int = 1024,
        verbose: bool = False,
    ):
        super().__init__(address, _Handler)
        self.predictor = predictor
        self.model_name = model_name
        self.max_batch_size = max_batch_size
        self.verbose = verbose
        # a full batch as JSON text (a float32 takes at most ~16 characters, with the
        # separator) plus room for the envelope: a larger body is refused before it is read
        size = max_batch_size * math.prod(predictor.input_shape)
        self.max_body_bytes = size * BYTES_PER_NUMBER + ENVELOPE_BYTES
        self.request_timeout = REQUEST_TIMEOUT_S  # per socket read or write of one client
        # one forward pass at a time: not every predictor is re-entrant
        self.lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        return f"http://{host}:{port}"

    def model_metadata(self) -> dict[str, Any]:
        p = self.predictor
        return {
            "name": self.model_name,
            "versions": [MODEL_VERSION],
            "platform": f"aisafety_{type(p).__name__}",
            "inputs": [{"name": INPUT_NAME, "datatype": "FP32", "shape": [-1, *p.input_shape]}],
            "outputs": [{"name": OUTPUT_NAME, "datatype": "FP32", "shape": [-1, p.num_classes]}],
        }

    def start(self) -> OIPServer:
        """Serve from a daemon thread (for tests and notebooks); ``close()`` stops it.

        Idempotent: two serving loops on one server would make ``close()`` hang."""
        if self._thread is not None:
            return self
        self._thread = threading.Thread(target=self.serve_forever, args=(0.1,), daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self.shutdown()
            self._thread.join()
            self._thread = None
        self.server_close()

    def __enter__(self) -> OIPServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Handler(BaseHTTPRequestHandler):
    server: OIPServer
    protocol_version = "HTTP/1.1"
    server_version = f"aisafety/{__version__}"

    def setup(self) -> None:
        """A client that sends or reads nothing for ``request_timeout`` seconds is dropped
        (its thread ends) instead of holding a thread forever."""
        self.timeout = self.server.request_timeout
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib signature)
        if self.server.verbose:
            super().log_message(format, *args)

    # -- plumbing ------------------------------------------------------------------------

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode(), {"Content-Type": "application/json"})

    def _dispatch(self, method: str) -> None:
        try:
            self._route(method)
        except RequestError as exc:
            self._json(exc.status, {"error": str(exc)})
        except Exception as exc:  # never leave a client without an answer
            self._json(500, {"error": f"internal error: {type(exc).__name__}: {exc}"})

    def do_GET(self) -> None:  # noqa: N802 (stdlib naming)
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    # -- routes --------------------------------------------------------------------------

    def _route(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        if method == "GET" and path.rstrip("/") == "/v2":
            self._json(200, {"name": "aisafety", "version": __version__, "extensions": []})
            return
        if path in ("/v2/health/live", "/v2/health/ready"):
            self._allow(method, "GET")
            self._json(200, {path.rsplit("/", 1)[1]: True})
            return
        match = _MODEL_PATH.match(path)
        if not match:
            raise RequestError(404, f"no such endpoint {path!r}; see /v2/models/{{name}}")
        name, version, action = match["name"], match["version"], match["action"]
        if name != self.server.model_name:
            raise RequestError(
                404, f"model {name!r} is not served here; served: {self.server.model_name!r}"
            )
        if version not in (None, MODEL_VERSION):
            raise RequestError(404, f"model {name!r} has no version {version!r}; versions: ['1']")
        if action is None:
            self._allow(method, "GET")
            self._json(200, self.server.model_metadata())
        elif action == "/ready":
            self._allow(method, "GET")
            self._json(200, {"name": name, "ready": True})
        else:
            self._allow(method, "POST")
            self._infer()

    def _allow(self, method: str, allowed: str) -> None:
        if method != allowed:
            raise RequestError(405, f"{self.path} takes {allowed}, not {method}")

    def _read_body(self) -> tuple[dict[str, Any], bytes]:
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            raise RequestError(400, "Content-Length is not a number") from None
        if length > self.server.max_body_bytes:  # refused before a byte of it is read
            self.close_connection = True  # the unread body must not be taken for a request
            raise RequestError(
                413,
                f"the request body of {length:,} bytes exceeds this server's limit of "
                f"{self.server.max_body_bytes:,} (max_batch_size {self.server.max_batch_size} "
                "inputs as JSON); send smaller batches",
            )
        raw = self.rfile.read(length) if length > 0 else b""
        header_length = self.headers.get(_BINARY_HEADER)
        binary = b""
        if header_length is not None:
            try:
                split = int(header_length)
            except ValueError:
                raise RequestError(400, f"{_BINARY_HEADER} is not a number") from None
            if not 0 <= split <= len(raw):
                raise RequestError(400, f"{_BINARY_HEADER} {split} exceeds the body")
            raw, binary = raw[:split], raw[split:]
        try:
            request = json.loads(raw or b"null")
        except ValueError as exc:
            raise RequestError(400, f"the request body is not valid JSON: {exc}") from None
        except RecursionError:
            raise RequestError(400, "the request body is JSON nested too deeply") from None
        if not isinstance(request, dict):
            raise RequestError(400, 'the request body must be a JSON object {"inputs": [...]}')
        return request, binary

    def _input_array(self, request: dict[str, Any], binary: bytes) -> np.ndarray:
        inputs = request.get("inputs")
        if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
            raise RequestError(400, f"give exactly one input tensor, named {INPUT_NAME!r}")
        tensor = inputs[0]
        if tensor.get("name") != INPUT_NAME:
            raise RequestError(
                400, f"unknown input {tensor.get('name')!r}; the model's input is {INPUT_NAME!r}"
            )
        if tensor.get("datatype") != "FP32":
            raise RequestError(400, f"input datatype {tensor.get('datatype')!r}; send FP32")
        shape = tensor.get("shape")
        if (
            not isinstance(shape, list)
            or len(shape) < 2
            or not all(isinstance(d, int) and d >= 0 for d in shape)
        ):
            raise RequestError(400, f"input shape {shape!r} is not a list [N, ...] of sizes")
        check_sample_shape(shape, tuple(self.server.predictor.input_shape))
        size = (tensor.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size != len(binary):
                raise RequestError(400, f"binary_data_size {size!r} does not match the body")
            values = np.frombuffer(binary, dtype="<f4")
        else:
            try:
                values = np.asarray(tensor.get("data"), dtype=np.float32).reshape(-1)
            except (TypeError, ValueError):
                raise RequestError(
                    400, "input data must be a (flat or nested) list of numbers"
                ) from None
        if values.size != math.prod(shape):
            raise RequestError(
                400, f"input shape {shape} needs {math.prod(shape)} values, got {values.size}"
            )
        return values.reshape(shape[0], *self.server.predictor.input_shape)

    def _infer(self) -> None:
        request, binary = self._read_body()
        x = self._input_array(request, binary)
        binary_out = bool((request.get("parameters") or {}).get("binary_data_output"))
        for wanted in request.get("outputs") or []:
            if not isinstance(wanted, dict) or wanted.get("name") != OUTPUT_NAME:
                raise RequestError(400, f"unknown output {wanted!r}; the output is {OUTPUT_NAME!r}")
            binary_out = bool((wanted.get("parameters") or {}).get("binary_data", binary_out))
        predictor = self.server.predictor
        batch = torch.from_numpy(np.array(x, dtype=np.float32))  # a writable copy
        parts = []
        try:
            with self.server.lock, torch.inference_mode():
                for start in range(0, len(batch), self.server.max_batch_size):
                    chunk = batch[start : start + self.server.max_batch_size]
                    parts.append(predictor.logits(chunk.to(predictor.device)).float().cpu())
        except AISafetyError as exc:  # e.g. inputs outside [0, 1]
            raise RequestError(400, str(exc)) from None
        logits = torch.cat(parts) if parts else torch.zeros((0, predictor.num_classes))
        output: dict[str, Any] = {
            "name": OUTPUT_NAME,
            "datatype": "FP32",
            "shape": list(logits.shape),
        }
        response: dict[str, Any] = {
            "model_name": self.server.model_name,
            "model_version": MODEL_VERSION,
            "outputs": [output],
        }
        if "id" in request:
            response["id"] = request["id"]
        if not binary_out:
            output["data"] = logits.reshape(-1).tolist()
            self._json(200, response)
            return
        data = logits.numpy().astype("<f4").tobytes()
        output["parameters"] = {"binary_data_size": len(data)}
        header = json.dumps(response).encode()
        self._send(
            200,
            header + data,
            {"Content-Type": "application/octet-stream", _BINARY_HEADER: str(len(header))},
        )


def check_sample_shape(shape: list[int], takes: tuple[int, ...]) -> None:
    """Refuse a request shape ``[N, ...]`` whose values this model would read scrambled.

    The values are read row-major as ``[N, *takes]`` (C, H, W). Accepted: that shape, and any
    shape that only merges or splits neighbouring dimensions of it or adds or drops size-1
    ones (``[N, C*H*W]`` flat, ``[N, H, W]`` for one channel, ``[N, C, H*W]``): the same
    values in the same order. Refused, although the count matches: any other order, such as
    channels-last ``[N, H, W, C]``, which a client that skipped the metadata sends."""
    sample, expected = tuple(shape[1:]), f"[N, {', '.join(map(str, takes))}]"
    if math.prod(sample) != math.prod(takes):
        raise RequestError(
            400,
            f"input shape {shape} has {math.prod(sample)} values per sample; the model "
            f"takes {expected}",
        )
    if same_order(takes, sample):
        return
    said = (
        f"input shape {shape} holds the model's {math.prod(takes)} values per sample in "
        f"another order than the {expected} it reads (row-major; GET the model's metadata), "
        "so every image would reach it scrambled; "
    )
    if len(takes) == 3 and sample == (takes[1], takes[2], takes[0]):
        raise RequestError(
            400,
            said + f"these are channels-last images: send [N, {', '.join(map(str, takes))}] "
            "(numpy: x.transpose(0, 3, 1, 2)), or serve the model with "
            "'aisafety serve MODEL.onnx --layout nhwc' if it is a channels-last graph",
        )
    raise RequestError(
        400, said + f"send {expected}, or the same values flat as [N, {math.prod(takes)}]"
    )


def make_server(
    predictor: Predictor,
    host: str = "127.0.0.1",
    port: int = 0,
    model_name: str | None = None,
    *,
    max_batch_size: int = 1024,
    verbose: bool = False,
) -> OIPServer:
    """An OIP v2 server for ``predictor``, bound but not yet serving (port 0 = any free)."""
    name = model_name or predictor.name
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
        raise ConfigError(
            f"model name {name!r} cannot appear in a URL path; give model_name made of "
            "letters, digits, '.', '_' and '-'"
        )
    if max_batch_size <= 0:
        raise ConfigError(f"max_batch_size must be > 0, got {max_batch_size}")
    return OIPServer((host, port), predictor, name, max_batch_size, verbose)


def serve(
    predictor: Predictor,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_name: str | None = None,
    *,
    max_batch_size: int = 1024,
    verbose: bool = True,
) -> None:
    """Serve ``predictor`` until interrupted (Ctrl-C or SIGTERM).

    The default host answers only this machine; give ``0.0.0.0`` to serve the network (as
    the container image does).
    """
    server = make_server(
        predictor, host, port, model_name, max_batch_size=max_batch_size, verbose=verbose
    )
    print(
        f"serving model {server.model_name!r} ({type(predictor).__name__}, input "
        f"{list(predictor.input_shape)}, {predictor.num_classes} classes) at "
        f"http://{host}:{server.server_address[1]}/v2/models/{server.model_name}",
        flush=True,
    )
    previous = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is threading.main_thread():  # `docker stop` sends SIGTERM
        signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def parse_numbers(text: str | None, what: str, cast: type = float) -> tuple | None:
    """``"1,28,28"`` -> ``(1, 28, 28)`` for command-line options; ``None`` stays ``None``."""
    if text is None or not text.strip():
        return None
    try:
        return tuple(cast(part) for part in text.replace(" ", "").split(","))
    except ValueError:
        raise ConfigError(
            f"{what} {text!r} is not a comma-separated list of {cast.__name__}s, e.g. 1,28,28"
        ) from None


_TORCHSCRIPT_SUFFIXES = (".pt", ".pth", ".ts", ".jit", ".torchscript")


def open_model(
    model: str,
    *,
    input_shape: Sequence[int] | None = None,
    num_classes: int | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    device: str | torch.device = "cpu",
    layout: str = "nchw",
) -> Predictor:
    """A predictor for a zoo name, an ``.onnx`` file or a TorchScript archive (for ``serve``).
    ``layout``: ``nhwc`` for a channels-last ONNX graph, which is then served as (C, H, W)."""
    path = Path(model).expanduser()
    if path.suffix.lower() == ".onnx":
        from aisafety.prediction.onnx_model import load_onnx

        return load_onnx(
            path, input_shape=input_shape, num_classes=num_classes, mean=mean, std=std,
            layout=layout,
        )  # fmt: skip
    if layout != "nchw":
        raise ConfigError(
            f"--layout {layout} applies to ONNX files only; model {model!r} is not one "
            "(a PyTorch network takes channels-first images)"
        )
    if path.suffix.lower() in _TORCHSCRIPT_SUFFIXES or path.is_file():
        from aisafety.prediction.torchscript import TorchScriptPredictor

        if input_shape is None:
            raise ConfigError(
                f"TorchScript model {model!r}: give its input shape (C, H, W), "
                "e.g. --input-shape 1,28,28"
            )
        return TorchScriptPredictor(
            path, input_shape, num_classes, mean=mean, std=std, device=device
        )
    from aisafety.database.zoo import load_zoo_model

    return load_zoo_model(model, device)
