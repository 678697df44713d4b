"""The smoothing certificates compared on the zoo's smoothing models, same draws for all.

    python bench/smoothing_certificates.py [--models ...] [--n 1000] [--n0 100]
        [--alpha 0.001] [--images 100] [--threads 1]

Each model is smoothed with the noise and scale it was trained for, CERTIFY's draws are
made once per model (``estimate``), and every bound defined for that noise turns the same
p_A lower bounds into radii (``certify_every_bound``): Neyman-Pearson, PixelDP,
f-divergence (KL) and Rényi for Gaussian (l2) and Laplace (l1) noise, Neyman-Pearson only
for uniform noise. Prints certified accuracy at fifths of the largest radius n draws can
give (Neyman-Pearson's at p_A = alpha^(1/n), every draw right) and the ACR per bound, and
checks on every image that Neyman-Pearson's radius is at least every other bound's and
Rényi's at least KL's (the orderings the literature proves).
"""

from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np
import torch

from aisafety.database.datasets.embedded import EmbeddedMnist
from aisafety.database.zoo import load_zoo_model
from aisafety.defense.randomized_smoothing import RandomizedSmoothing
from aisafety.defense.smoothing.certify import Bound, certify_every_bound, estimate
from aisafety.defense.smoothing.noise import Noise, certified_radius

# zoo entry -> (noise, scale) it was trained with
MODELS = {
    "mnist-cnn-gaussian-0.25": ("gaussian", 0.25),
    "mnist-cnn-smoothadv-0.25": ("gaussian", 0.25),
    "mnist-cnn-smoothadv-pretrained-0.25": ("gaussian", 0.25),
    "mnist-cnn-adre-0.25": ("gaussian", 0.25),
    "mnist-cnn-gaussian-0.5": ("gaussian", 0.5),
    "mnist-cnn-macer-0.5": ("gaussian", 0.5),
    "mnist-cnn-laplace-0.25": ("laplace", 0.25),
    "mnist-cnn-uniform-0.5": ("uniform", 0.5),
}
# radii as fractions of the largest radius n draws can certify (every draw right)
FRACTIONS = [0.2, 0.4, 0.6, 0.8, 1.0]


def ordering_violations(certs: dict) -> int:
    """Images where a proved ordering fails: NP >= every bound, Rényi >= KL (1e-9 relative:
    Rényi's own rounding margin)."""
    top = certs[Bound.NEYMAN_PEARSON].radius
    bad = np.zeros_like(top, dtype=bool)
    for cert in certs.values():
        bad |= cert.radius > top
    if Bound.RENYI in certs:
        bad |= certs[Bound.RENYI].radius < certs[Bound.F_DIVERGENCE].radius * (1 - 2e-9)
    return int(bad.sum())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--n0", type=int, default=100)
    parser.add_argument("--alpha", type=float, default=0.001)
    parser.add_argument("--images", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = EmbeddedMnist().load(None, "test").balanced_subset(args.images, 0)
    y = data.y.numpy()
    print(
        f"CERTIFY n0={args.n0} n={args.n} alpha={args.alpha}, seed 0, on {len(data)} "
        f"class-balanced MNIST test images; load average {os.getloadavg()[0]:.1f}"
    )
    for name in args.models:
        noise, sigma = MODELS[name]
        settings = {"noise": noise, "sigma": sigma, "seed": 0, "batch_size": 1000}
        smoothed = RandomizedSmoothing(load_zoo_model(name), settings)
        started = time.process_time()
        est = estimate(smoothed, data.x, args.n0, args.n, args.alpha)
        certs = certify_every_bound(est)
        norm = next(iter(certs.values())).norm
        print(f"\n{name} ({noise} {sigma}, {norm}; {time.process_time() - started:.0f} s CPU)")
        cap = certified_radius(Noise(noise), sigma, np.array([args.alpha ** (1 / args.n)]))[0]
        radii = [math.floor(f * cap * 1000) / 1000 for f in FRACTIONS]  # the cap itself counts
        print(f"  {'bound':22s} " + " ".join(f"r={r:<5g}" for r in radii) + "    ACR")
        for bound, cert in certs.items():
            cells = " ".join(f"{cert.certified_correct(y, r).mean():7.0%}" for r in radii)
            acr = np.where(cert.prediction == y, cert.radius, 0.0).mean()
            print(f"  {bound.value:22s} {cells}   {acr:.3f}")
        print(f"  ordering violations: {ordering_violations(certs)} of {len(y)} images")


if __name__ == "__main__":
    main()
