"""The tangent points of the S-shape lines by the 50-step bisection that
``SShapeRelaxation._touch``'s Newton method replaced (#33's eighth session), kept verbatim:
the reference of tests/test_sshape_touch.py and the baseline of bench/sshape_touch.py."""

from __future__ import annotations

import torch


def bisection_touch(self, lo, hi, anchor):
    """The replaced ``_touch`` (#33's eighth session), verbatim: 50 halvings between the far
    end and 0, on every interval, keeping the valid end."""
    below = anchor is hi
    far = lo.clamp(max=0) if below else hi.clamp(min=0)
    near = torch.zeros_like(far)
    target = self.fn(anchor)
    for _ in range(50):
        d = (far + near) / 2
        line = self.fn(d) + self.derivative(d) * (anchor - d)
        valid = line <= target if below else line >= target
        far, near = torch.where(valid, d, far), torch.where(valid, near, d)
    return far


def bisection_slopes(self, lo, hi):
    """The replaced ``tangent_slopes``, with the bisection's tangent points."""
    chord, mid = self.chord(lo, hi), self.derivative((lo + hi) / 2)
    low_d, up_d = bisection_touch(self, lo, hi, hi), bisection_touch(self, lo, hi, lo)
    m, derivative = (lo + hi) / 2, self.derivative
    low_mixed = torch.where(chord < derivative(lo), chord, derivative(torch.minimum(low_d, m)))
    up_mixed = torch.where(chord < derivative(hi), chord, derivative(torch.maximum(up_d, m)))
    down = torch.where(hi <= 0, mid, torch.where(lo >= 0, chord, low_mixed))
    up = torch.where(hi <= 0, chord, torch.where(lo >= 0, mid, up_mixed))
    return down, up
