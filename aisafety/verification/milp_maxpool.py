"""Max-pooling in the MILP and its LP relaxation (``milp.encode``).

Each output y = max(x_1..x_k) of a window, on sound bounds [l_i, u_i] of its inputs, with
L = max_i l_i (the winner i*: the element of largest lower bound). An element with
u_j <= L never exceeds x_i*, so it is dropped (the max of the rest is the same). When only
i* is left, y = x_i* exactly: an affine expression, no variable. Otherwise y gets a variable
in [L, U] (U = max u_i over the kept elements) and each kept element a binary d_i:

    y >= x_i,   y <= x_i + (U - l_i)(1 - d_i),   sum_i d_i = 1

(Tjeng et al. 2019; exact: d_i = 1 forces y = x_i, and d_i = 0 leaves y <= U). With the
binaries relaxed to [0, 1] this is a sound LP; we add the valid row

    y <= L + sum_i (x_i - l_i)

(the largest element exceeds L by at most its own x_i - l_i, and every term is >= 0),
which the relaxed big-M rows do not imply (on [0, 1]^2 at x = 0 they allow y = 1/2, this
row y = 0); with y <= U it is the concave envelope of the max on a box of two equal
ranges. ``y >= x_j`` is kept for the dropped elements too (cheap, and so the LP contains
CROWN's lower line y >= x_i* for any winner a looser box picks)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from aisafety.verification.ops import Box, MaxPool


@dataclass
class PoolPlan:
    """One max-pool's windows on its input box (flat indices: input c*H*W + position,
    output c*windows + window)."""

    winner: np.ndarray  # (outputs,) input index of each window's largest lower bound
    inexact: np.ndarray  # (n,) the outputs that get a variable y
    low: np.ndarray  # (n,) L of those outputs
    top: np.ndarray  # (n,) U of those outputs
    members: np.ndarray  # (m, 2) (position in inexact, input index): kept elements, binaries
    others: np.ndarray  # (r, 2) the same for every element of an inexact output (y >= x)
    in_lower: np.ndarray  # (inputs,) the input box's lower bounds

    @property
    def n_vars(self) -> int:
        """One y per inexact output and one binary per kept element."""
        return len(self.inexact) + len(self.members)


def plan(op: MaxPool, box: Box) -> PoolPlan:
    """The windows of ``op`` on ``box`` (batch of one)."""
    lo, hi = (t[:1].double() for t in box)
    channels, height, width = op.in_shape
    area = height * width
    flat = torch.arange(area, dtype=torch.float64).reshape(1, 1, height, width)
    positions = op.windows(flat, -1.0)[0, 0].long()  # (kk, windows); -1: padding
    lows, highs = op.windows(lo, -torch.inf)[0], op.windows(hi, -torch.inf)[0]  # (C, kk, W)
    big_l, best = lows.max(1)
    keep = highs > big_l.unsqueeze(1)
    keep.scatter_(1, best.unsqueeze(1), True)
    valid = (positions >= 0).expand_as(keep)
    keep &= valid
    index = positions + area * torch.arange(channels).reshape(-1, 1, 1)  # (C, kk, W)
    winner = index.gather(1, best.unsqueeze(1))[:, 0].flatten()
    inexact = (keep.sum(1) > 1).flatten()
    top = highs.masked_fill(~keep, -torch.inf).amax(1).flatten()
    rank = torch.full(inexact.shape, -1, dtype=torch.long)
    rank[inexact] = torch.arange(int(inexact.sum()))

    def pairs(mask: torch.Tensor) -> np.ndarray:
        c, k, w = torch.nonzero(mask & inexact.reshape(channels, 1, -1), as_tuple=True)
        return torch.stack([rank[c * keep.shape[2] + w], index[c, k, w]], 1).numpy()

    return PoolPlan(winner.numpy(), torch.nonzero(inexact).flatten().numpy(),
                    big_l.flatten()[inexact].numpy(), top[inexact].numpy(), pairs(keep),
                    pairs(valid), lo.flatten().numpy())  # fmt: skip


def encode_pool(pool: PoolPlan, matrix: torch.Tensor, const: torch.Tensor, first: int):
    """The pool's output as (matrix, const) of the variables, its variable bounds and its
    rows, given its input z = vars @ matrix + const (``matrix`` (n_vars, inputs)). Variables
    from ``first``: the y's, then the binaries."""
    from scipy.sparse import csr_matrix

    n_vars, n, m = matrix.shape[0], len(pool.inexact), len(pool.members)
    out_matrix = matrix[:, pool.winner].clone()
    out_const = const[pool.winner].clone()
    y_vars, d_vars = first + np.arange(n), first + n + np.arange(m)
    out_matrix[:, pool.inexact] = 0.0
    out_matrix[y_vars, pool.inexact] = 1.0
    out_const[pool.inexact] = 0.0
    z, c = matrix.numpy(), const.numpy()

    def sparse(rows: np.ndarray, columns: np.ndarray, values, count: int) -> csr_matrix:
        values = np.broadcast_to(np.asarray(values, dtype=np.float64), rows.shape)
        return csr_matrix((values, (rows, columns)), shape=(count, n_vars))

    r = len(pool.others)
    at, element = pool.others[:, 0], pool.others[:, 1]
    below = sparse(np.arange(r), y_vars[at], 1.0, r) - csr_matrix(z[:, element].T)
    below_lo = c[element]
    at, element = pool.members[:, 0], pool.members[:, 1]
    big_m = pool.top[at] - pool.in_lower[element]
    above = (sparse(np.arange(m), y_vars[at], 1.0, m) - csr_matrix(z[:, element].T)
             + sparse(np.arange(m), d_vars, big_m, m))  # fmt: skip
    one = sparse(at, d_vars, 1.0, n)
    owners = csr_matrix((np.ones(m), (at, np.arange(m))), shape=(n, m))
    envelope = sparse(np.arange(n), y_vars, 1.0, n) - csr_matrix(owners @ z[:, element].T)
    envelope_hi = pool.low + owners @ (c[element] - pool.in_lower[element])
    inf = np.inf
    rows = [below, above, one, envelope]
    row_lo = [below_lo, np.full(m, -inf), np.ones(n), np.full(n, -inf)]
    row_hi = [np.full(r, inf), c[element] + big_m, np.ones(n), envelope_hi]
    return (out_matrix, out_const), (y_vars, d_vars), rows, row_lo, row_hi
