# A model server speaking the Open Inference Protocol v2 (REST), like KServe/Triton/MLServer:
#   docker build -f docker/serve.Dockerfile -t aisafety-serve .
#   docker run --rm -p 8000:8000 aisafety-serve                       # the zoo's mnist-cnn
#   docker run --rm -p 8000:8000 -v "$PWD/models:/models" aisafety-serve \
#       /models/net.onnx --input-shape 1,28,28 --host 0.0.0.0 --name net
# then: curl localhost:8000/v2/models/mnist-cnn (metadata), POST .../infer (see docs/prediction.md)
FROM python:3.11-slim

# PASSIVE: idle OpenMP threads sleep instead of spinning between small requests.
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=PASSIVE
# CPU build of torch keeps the image small; use a CUDA base image and wheel for GPUs.
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch>=2.1"

WORKDIR /src
COPY pyproject.toml README.md ./
COPY aisafety ./aisafety
COPY database ./database
# [onnx] = onnxruntime + onnx, enough to serve .onnx files (serving needs no gradients).
RUN pip install ".[onnx]" && rm -rf /src

RUN useradd --create-home --uid 10001 aisafety
USER aisafety
WORKDIR /home/aisafety

EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=4)"]
ENTRYPOINT ["aisafety", "serve"]
CMD ["mnist-cnn", "--host", "0.0.0.0", "--port", "8000"]
