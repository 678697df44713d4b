// A tiny Open Inference Protocol v2 (REST) server in plain Node.js (only the `http` and `fs`
// modules): it serves a linear classifier, logits = W x + b, so tests can check that a model
// written in another language is evaluated through `RemotePredictor` exactly like the same
// model in-process.
//
//   node tests/node_oip_server.js --weights weights.json [--port 0] [--name linear]
//
// weights.json: {"W": [[...784 numbers...] x 10], "b": [...10 numbers...]}. The bound port is
// printed on stdout as `listening <port>` (port 0 picks a free one).
"use strict";

const fs = require("fs");
const http = require("http");

function option(name, fallback) {
  const at = process.argv.indexOf(`--${name}`);
  return at >= 0 && at + 1 < process.argv.length ? process.argv[at + 1] : fallback;
}

const weights = JSON.parse(fs.readFileSync(option("weights"), "utf8"));
const modelName = option("name", "linear");
const port = Number(option("port", "0"));
const classes = weights.b.length;
const features = weights.W[0].length;
// float32 storage, as the in-process PyTorch model keeps its weights
const W = weights.W.map((row) => Float32Array.from(row));
const b = Float32Array.from(weights.b);

function reply(res, status, payload) {
  const body = JSON.stringify(payload);
  res.writeHead(status, {
    "Content-Type": "application/json",
    "Content-Length": Buffer.byteLength(body),
  });
  res.end(body);
}

function infer(request) {
  const inputs = request.inputs;
  if (!Array.isArray(inputs) || inputs.length !== 1) {
    throw new Error("give exactly one input tensor");
  }
  const tensor = inputs[0];
  if (tensor.datatype !== "FP32") throw new Error(`datatype ${tensor.datatype}; send FP32`);
  const shape = tensor.shape;
  const n = shape[0];
  const perSample = shape.slice(1).reduce((a, d) => a * d, 1);
  const data = Float32Array.from(tensor.data.flat(Infinity));
  if (perSample !== features || data.length !== n * features) {
    throw new Error(`input shape ${JSON.stringify(shape)} does not hold ${features} values per sample`);
  }
  const out = new Array(n * classes);
  for (let i = 0; i < n; i++) {
    for (let k = 0; k < classes; k++) {
      let sum = 0;
      const row = W[k];
      for (let j = 0; j < features; j++) sum += row[j] * data[i * features + j];
      out[i * classes + k] = Math.fround(sum + b[k]);
    }
  }
  return {
    model_name: modelName,
    model_version: "1",
    outputs: [{ name: "logits", datatype: "FP32", shape: [n, classes], data: out }],
  };
}

const metadata = {
  name: modelName,
  versions: ["1"],
  platform: "nodejs-linear",
  inputs: [{ name: "input", datatype: "FP32", shape: [-1, 1, 28, 28] }],
  outputs: [{ name: "logits", datatype: "FP32", shape: [-1, classes] }],
};

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (chunk) => chunks.push(chunk));
  req.on("end", () => {
    const path = req.url.split("?")[0];
    const model = `/v2/models/${modelName}`;
    if (req.method === "GET" && path === "/v2/health/live") return reply(res, 200, { live: true });
    if (req.method === "GET" && path === "/v2/health/ready") return reply(res, 200, { ready: true });
    if (req.method === "GET" && path === model) return reply(res, 200, metadata);
    if (req.method === "GET" && path === `${model}/ready`) {
      return reply(res, 200, { name: modelName, ready: true });
    }
    if (req.method === "POST" && path === `${model}/infer`) {
      let request;
      try {
        request = JSON.parse(Buffer.concat(chunks).toString("utf8"));
      } catch (err) {
        return reply(res, 400, { error: `body is not JSON: ${err.message}` });
      }
      try {
        return reply(res, 200, infer(request));
      } catch (err) {
        return reply(res, 400, { error: err.message });
      }
    }
    return reply(res, 404, { error: `no such endpoint ${req.method} ${path}` });
  });
});

server.listen(port, "127.0.0.1", () => {
  console.log(`listening ${server.address().port}`);
});

for (const signal of ["SIGTERM", "SIGINT"]) process.on(signal, () => server.close(() => process.exit(0)));
