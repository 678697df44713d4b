"""A model served by another program, spoken to over the Open Inference Protocol v2 (REST).

The Open Inference Protocol ("KServe v2") is what KServe, NVIDIA Triton, Seldon MLServer
and TorchServe speak, so a model written in any language and served by any of them (or by
``aisafety serve``) can be evaluated. The subset used:

- ``GET  {url}/v2/models/{name}``        metadata: the input's name, datatype and shape, and
                                          the output's shape (to learn num_classes);
- ``POST {url}/v2/models/{name}/infer``  ``{"inputs": [{"name", "shape", "datatype": "FP32",
                                          "data": [flat, row-major]}]}``; the logits are read
                                          from ``outputs[0]`` (``shape``, ``data``).

Only scores come back, so the predictor offers scores and labels: score- and decision-based
attacks work on it, gradient attacks are refused by name. Only the standard library is used.
"""

from __future__ import annotations

import http.client
import itertools
import json
import math
import operator
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from aisafety.errors import AISafetyError, ConfigError
from aisafety.interfaces import Capability
from aisafety.prediction.base import Predictor

RESPONSE_BYTES_PER_NUMBER = 32  # a score as JSON text with its separator, and a margin
RESPONSE_ENVELOPE_BYTES = 1 << 20  # the answer's JSON around the scores; metadata answers
CHUNK_BYTES = 1 << 16


class RemoteError(AISafetyError):
    """Talking to a remote model failed; the message names the URL."""


class RemoteConnectionError(RemoteError):
    """The server could not be reached (refused, reset, name not resolved)."""


class RemoteTimeoutError(RemoteError):
    """The server did not answer within the per-request timeout."""


class RemoteHTTPError(RemoteError):
    """The server answered with an HTTP error status."""

    def __init__(self, message: str, status: int, body: str):
        super().__init__(message)  # args stay (message,) so str() is the message
        self.status, self.body = status, body


class RemoteResponseError(RemoteError):
    """The server answered 200 but with something that is not usable logits."""


def _excerpt(body: bytes | str, limit: int = 300) -> str:
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


def same_order(shape: Sequence[int], sample: Sequence[int]) -> bool:
    """Whether the server reads values sent row-major as ``shape`` in the same order: its
    per-sample ``sample`` only merges or splits neighbouring dimensions (or adds and drops
    size-1 ones), as a flat ``[784]`` or ``[28, 28]`` for (1, 28, 28) do; (32, 32, 3) for
    (3, 32, 32) does not. One of the two must cut the values where the other does: the
    set of running products of one holds the other's."""
    cuts = [
        {p for p in itertools.accumulate(dims, operator.mul) if p > 1} for dims in (shape, sample)
    ]
    return cuts[0] <= cuts[1] or cuts[1] <= cuts[0]


class RemotePredictor(Predictor):
    """A classifier behind an OIP v2 REST endpoint.

    ``url`` is the server's base (``http://host:8000``); ``model_name`` the served model.
    ``input_shape`` (C, H, W) and the input's name and per-sample shape are read from the
    model metadata when not given; ``num_classes`` from the metadata's output shape, or from
    one probe request. Batches are split into requests of at most ``max_batch_size``
    samples. Connection errors, timeouts and 5xx answers are retried ``retries`` times,
    waiting ``backoff * 2**attempt`` seconds in between; 4xx answers are not retried.
    """

    engine = "a remote model (its server computes the scores)"

    def __init__(
        self,
        url: str,
        model_name: str,
        input_shape: Sequence[int] | None = None,
        num_classes: int | None = None,
        *,
        input_name: str | None = None,
        name: str | None = None,
        max_batch_size: int = 64,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        headers: dict[str, str] | None = None,
    ):
        scheme = url.split("://", 1)[0].lower() if "://" in url else None
        if scheme not in (None, "http", "https"):
            raise ConfigError(
                f"remote model url {url!r} uses the scheme {scheme!r}; a model server is "
                "reached over http:// or https:// (e.g. http://localhost:8000)"
            )
        if scheme is None:
            url = f"http://{url}"
        self.url = url.rstrip("/")
        self.model_name = model_name
        self.name = name or f"{model_name}@{self.url}"
        if max_batch_size <= 0 or timeout <= 0 or retries < 0 or backoff < 0:
            raise ConfigError(
                f"remote model {self.name!r}: max_batch_size and timeout must be > 0, retries "
                f"and backoff >= 0 (got {max_batch_size}, {timeout}, {retries}, {backoff})"
            )
        self.max_batch_size, self.timeout = int(max_batch_size), float(timeout)
        self.retries, self.backoff = int(retries), float(backoff)
        self.headers = dict(headers or {})
        self.capabilities = frozenset({Capability.SCORES, Capability.LABELS})
        self.device = torch.device("cpu")
        self.requests_sent = 0
        meta: dict[str, Any] = {}
        if input_shape is None or input_name is None or num_classes is None:
            meta = self.metadata()
        meta_input = (meta.get("inputs") or [{}])[0]
        self.input_name = input_name or meta_input.get("name") or "input"
        shapes = self._shapes(input_shape, meta_input.get("shape"))
        self.input_shape, self.wire_shape = shapes  # type: ignore[assignment]
        self.num_classes = int(num_classes) if num_classes else self._classes(meta)

    # -- shape errors: the fix is on the serving side ------------------------------------

    def channels_last_fix(self, c: int, h: int, w: int) -> str:
        """A remote model takes no ``layout`` and its ``input_shape`` only relabels the wire
        shape (same values, scrambled): the server must take (C, H, W)."""
        return (
            f"the served model takes channels-last (H, W, C) = ({h}, {w}, {c}) images, the "
            "platform sends (C, H, W): serve a channels-last ONNX graph with 'aisafety serve "
            "MODEL.onnx --layout nhwc' (and '--scale 255' if it takes 0..255 pixels), or have "
            "the server take (C, H, W) images (docs/prediction.md)"
        )

    def size_fix(self, images: tuple[int, ...], takes: tuple[int, ...]) -> str:
        """The plan's model settings cannot resize for a server: the served model must."""
        (ih, iw), (th, tw) = images, takes
        return (
            f"the images are {ih}x{iw} and the served model takes {th}x{tw}: serve a model "
            f"that takes {ih}x{iw} images (one that resizes them first, e.g. nn.Sequential("
            f"nn.Upsample(size=({th}, {tw}), mode='bilinear'), net) exported and served), or "
            f"evaluate it on {th}x{tw} images (docs/own-model.md)"
        )

    # -- protocol ------------------------------------------------------------------------

    @property
    def model_url(self) -> str:
        return f"{self.url}/v2/models/{self.model_name}"

    def metadata(self) -> dict[str, Any]:
        """``GET /v2/models/{name}``: the served model's inputs and outputs."""
        meta = self._request("GET", self.model_url)
        if not isinstance(meta, dict):
            raise RemoteResponseError(f"{self.model_url} answered {meta!r}, not model metadata")
        return meta

    def ready(self) -> bool:
        """``GET /v2/models/{name}/ready``: True when the server says the model is ready."""
        try:
            self._request("GET", f"{self.model_url}/ready", retries=0)
        except RemoteError:
            return False
        return True

    def _shapes(
        self, given: Sequence[int] | None, meta_shape: Sequence[int] | None
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The platform's (C, H, W) and the per-sample shape sent on the wire."""
        try:
            sample = [int(d) for d in meta_shape[1:]] if meta_shape else []
            fixed_batch = int(meta_shape[0]) if meta_shape else -1
        except (TypeError, ValueError):
            sample, fixed_batch = [], -1  # symbolic dimensions: nothing to learn from them
        concrete = bool(sample) and all(d > 0 for d in sample)
        if given is not None:
            shape = tuple(int(s) for s in given)
            if len(shape) != 3:
                raise ConfigError(f"input_shape is (C, H, W), got {tuple(given)}")
        elif concrete and len(sample) == 3:
            shape = tuple(sample)
        else:
            raise ConfigError(
                f"remote model {self.name!r} declares input shape {list(meta_shape or [])}, "
                "which is not (N, C, H, W); give input_shape=(C, H, W), e.g. (1, 28, 28)"
            )
        if fixed_batch > 0:  # a model that takes a fixed batch size
            self.max_batch_size = min(self.max_batch_size, fixed_batch)
        if concrete and math.prod(sample) == math.prod(shape):
            if not same_order(shape, sample):
                raise ConfigError(self.order_problem(shape, tuple(sample)))
            return shape, tuple(sample)
        if concrete:
            raise ConfigError(
                f"remote model {self.name!r} takes {math.prod(sample)} values per sample "
                f"(shape {list(meta_shape or [])}), input_shape {shape} has {math.prod(shape)}"
            )
        return shape, shape

    def order_problem(self, shape: tuple[int, ...], sample: tuple[int, ...]) -> str:
        """The refusal of an ``input_shape`` whose values the server reads in another order:
        the values are sent row-major as (C, H, W), the server takes them as ``sample``."""
        c, h, w = shape
        said = (
            f"remote model {self.name!r}: input_shape {list(shape)} and the server's input "
            f"{list(sample)} hold as many values, but in another order, so every image would "
            "reach the model scrambled; "
        )
        if sample == (h, w, c):
            return said + self.channels_last_fix(c, h, w)
        return said + (
            "have the server take (C, H, W) images (or C*H*W flat values), or give the "
            "input_shape that is the server's input in (C, H, W) order (docs/prediction.md)"
        )

    def _classes(self, meta: dict[str, Any]) -> int:
        outputs = meta.get("outputs") or []
        shape = outputs[0].get("shape") if outputs and isinstance(outputs[0], dict) else None
        if shape and int(shape[-1]) > 1:
            return int(shape[-1])
        probe = torch.zeros((1, *self.input_shape))
        return int(self._infer(probe).shape[1])

    def infer_body(self, x: np.ndarray) -> dict[str, Any]:
        """The JSON body of one infer request for the float32 batch ``x``."""
        return {
            "inputs": [
                {
                    "name": self.input_name,
                    "shape": [len(x), *self.wire_shape],
                    "datatype": "FP32",
                    "data": x.reshape(-1).tolist(),
                }
            ]
        }

    def _infer(self, x: torch.Tensor) -> torch.Tensor:
        array = x.detach().cpu().numpy().astype(np.float32, copy=False)
        parts = []
        for start in range(0, len(array), self.max_batch_size):
            chunk = array[start : start + self.max_batch_size]
            answer = self._request("POST", f"{self.model_url}/infer", self.infer_body(chunk))
            parts.append(self._logits_from(answer, len(chunk)))
        if not parts:
            return torch.zeros((0, getattr(self, "num_classes", 0)))
        return torch.from_numpy(np.concatenate(parts))

    def _logits_from(self, answer: Any, n: int) -> np.ndarray:
        where = f"{self.model_url}/infer"
        try:
            output = answer["outputs"][0]
            shape = [int(d) for d in output["shape"]]
            data = output["data"]
        except (KeyError, IndexError, TypeError, ValueError):
            raise RemoteResponseError(
                f"{where} answered without outputs[0] with 'shape' and 'data' "
                f"(got {_excerpt(json.dumps(answer))}); is it an Open Inference Protocol v2 "
                "server? (binary outputs are not read: do not ask for them)"
            ) from None
        try:
            values = np.asarray(data, dtype=np.float32)
        except (TypeError, ValueError):
            raise RemoteResponseError(f"{where}: output data is not numeric") from None
        expected = getattr(self, "num_classes", None)
        per_sample = math.prod(shape[1:]) if len(shape) > 1 else 0
        if not shape or shape[0] != n or values.size != n * per_sample or per_sample < 2:
            raise RemoteResponseError(
                f"{where} returned output shape {shape} with {values.size} values for a "
                f"batch of {n}; expected ({n}, num_classes) logits"
            )
        logits = values.reshape(n, per_sample)
        if expected and per_sample != expected:
            raise RemoteResponseError(
                f"{where} returned {per_sample} scores per sample, but the model has "
                f"{expected} classes; check the served model and num_classes"
            )
        if not np.isfinite(logits).all():
            bad = int((~np.isfinite(logits)).any(1).sum())
            raise RemoteResponseError(
                f"{where} returned NaN or infinite scores for {bad} of {n} samples; "
                "the served model is broken or overflowing"
            )
        return logits

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self._infer(x)

    # -- transport -----------------------------------------------------------------------

    def _request(self, method: str, url: str, body: Any = None, retries: int | None = None) -> Any:
        """Send one request, retrying transient failures with exponential backoff."""
        retries = self.retries if retries is None else retries
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json", **self.headers}
        if data is not None:
            headers["Content-Type"] = "application/json"
        attempt = 0
        while True:
            try:
                return self._send(method, url, data, headers)
            except (RemoteConnectionError, RemoteTimeoutError) as exc:
                error: RemoteError = exc
            except RemoteHTTPError as exc:
                if exc.status < 500:
                    raise
                error = exc
            if attempt >= retries:
                if attempt:
                    error.args = (f"{error.args[0]} (after {attempt + 1} attempts)",)
                raise error
            time.sleep(self.backoff * 2**attempt)
            attempt += 1

    @property
    def max_response_bytes(self) -> int:
        """The largest answer read: a full batch of scores as JSON text, with room for the
        envelope (metadata and probes: the envelope alone)."""
        classes = getattr(self, "num_classes", 0)
        return self.max_batch_size * classes * RESPONSE_BYTES_PER_NUMBER + RESPONSE_ENVELOPE_BYTES

    def _read_bounded(self, response: Any, what: str) -> bytes:
        """The body, read in pieces: refused past ``max_response_bytes`` (a server answering
        gigabytes must not fill this process's memory) and past ``timeout`` seconds in all
        (a server trickling a byte a second answers each read in time, never finishing)."""
        deadline = time.monotonic() + self.timeout
        limit = self.max_response_bytes
        declared = response.headers.get("Content-Length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise RemoteResponseError(
                f"{what} announced an answer of {int(declared):,} bytes, above the limit of "
                f"{limit:,} for {self.max_batch_size} inputs; is this the model server?"
            )
        sock = getattr(getattr(response.fp, "raw", None), "_sock", None)
        parts, size = [], 0
        while True:
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise TimeoutError
                if sock is not None:
                    sock.settimeout(remaining)  # no read outlasts the whole request's time
                part = response.read1(CHUNK_BYTES)
            except TimeoutError:
                raise RemoteTimeoutError(
                    f"{what} did not finish its answer within {self.timeout:g} s (it sent "
                    f"{size:,} bytes); raise the timeout or lower max_batch_size"
                ) from None
            if not part:
                return b"".join(parts)
            size += len(part)
            if size > limit:
                raise RemoteResponseError(
                    f"{what} answered more than {limit:,} bytes, the limit for "
                    f"{self.max_batch_size} inputs of {getattr(self, 'num_classes', '?')} "
                    "scores; is this the model server?"
                )
            parts.append(part)

    def _send(self, method: str, url: str, data: bytes | None, headers: dict[str, str]) -> Any:
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        self.requests_sent += 1
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = self._read_bounded(response, f"{method} {url}")
        except urllib.error.HTTPError as exc:
            body = _excerpt(exc.read() or b"")
            raise RemoteHTTPError(
                f"{method} {url} failed with HTTP {exc.code} {exc.reason}: {body or '(no body)'}",
                exc.code,
                body,
            ) from None
        except TimeoutError:
            raise RemoteTimeoutError(
                f"{method} {url} did not answer within {self.timeout:g} s; raise the timeout "
                "or lower max_batch_size"
            ) from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, TimeoutError):
                raise RemoteTimeoutError(
                    f"{method} {url} did not answer within {self.timeout:g} s; raise the "
                    "timeout or lower max_batch_size"
                ) from None
            what = "connection refused" if isinstance(reason, ConnectionRefusedError) else reason
            raise RemoteConnectionError(
                f"cannot reach the model server at {self.url} ({what}); check that the server "
                "is running and that the URL and port are right"
            ) from None
        except (ConnectionError, http.client.HTTPException, OSError) as exc:
            raise RemoteConnectionError(
                f"the connection to {self.url} broke during {method} {url} "
                f"({type(exc).__name__}: {exc}); check that the server is running and healthy"
            ) from None
        try:
            return json.loads(raw)
        except ValueError:
            raise RemoteResponseError(
                f"{method} {url} answered with something that is not JSON: {_excerpt(raw)}"
            ) from None
