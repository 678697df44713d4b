# The platform with its scale-out extra (ray[client], psycopg): the image of every Ray node in
# docker/docker-compose.yml (docs/scale-out.md). Nodes and the driver must run the same
# aisafety, Ray and Python versions.
#   docker build -f docker/ray.Dockerfile -t aisafety-ray .
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0
# CPU build of torch keeps the image small; for GPU nodes use a CUDA base image and wheel
# (e.g. FROM nvidia/cuda:12.4.1-runtime-ubuntu22.04 and torch from the cu124 index).
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch>=2.1"

WORKDIR /src
COPY pyproject.toml README.md ./
COPY aisafety ./aisafety
COPY database ./database
RUN pip install ".[distributed]" && rm -rf /src

# plans, models and datasets live here on every node (the same paths everywhere)
WORKDIR /work
