"""An independent CTC implementation in numpy (log space), for tests only.

Graves et al. 2006: the extended label sequence l' = (blank, l1, blank, l2, ..., blank),
forward variables alpha and backward variables beta; -log p(l|x) and its gradient with
respect to the unnormalised activations u (softmax inputs):
    dL/du_t(k) = y_t(k) - 1/p * sum_{s: l'_s = k} alpha_t(s) beta_t(s)
with alpha, beta both including y_t(l'_s) (so their product counts it twice and is divided
by y once).
"""
from __future__ import annotations

import numpy as np


def _lse(*xs):
    m = max(xs)
    if m == -np.inf:
        return -np.inf
    return m + np.log(sum(np.exp(x - m) for x in xs))


def ctc_alpha_beta(log_y: np.ndarray, target: list[int], blank: int):
    """log_y: (T, C) log-probabilities. Returns (log alpha, log beta, ext), each (T, S')."""
    ext = [blank]
    for t in target:
        ext += [t, blank]
    T, S = log_y.shape[0], len(ext)
    la = np.full((T, S), -np.inf)
    lb = np.full((T, S), -np.inf)
    la[0, 0] = log_y[0, blank]
    if S > 1:
        la[0, 1] = log_y[0, ext[1]]
    for t in range(1, T):
        for s in range(S):
            terms = [la[t - 1, s]]
            if s >= 1:
                terms.append(la[t - 1, s - 1])
            if s >= 2 and ext[s] != blank and ext[s] != ext[s - 2]:
                terms.append(la[t - 1, s - 2])
            la[t, s] = _lse(*terms) + log_y[t, ext[s]]
    lb[T - 1, S - 1] = log_y[T - 1, ext[S - 1]]
    if S > 1:
        lb[T - 1, S - 2] = log_y[T - 1, ext[S - 2]]
    for t in range(T - 2, -1, -1):
        for s in range(S):
            terms = [lb[t + 1, s]]
            if s + 1 < S:
                terms.append(lb[t + 1, s + 1])
            if s + 2 < S and ext[s] != blank and ext[s] != ext[s + 2]:
                terms.append(lb[t + 1, s + 2])
            lb[t, s] = _lse(*terms) + log_y[t, ext[s]]
    return la, lb, ext


def ctc_loss(log_y: np.ndarray, target: list[int], blank: int) -> float:
    la, _, ext = ctc_alpha_beta(log_y, target, blank)
    S = len(ext)
    return -_lse(la[-1, S - 1], la[-1, S - 2] if S > 1 else -np.inf)


def ctc_grad_activations(u: np.ndarray, target: list[int], blank: int) -> np.ndarray:
    """Gradient of the CTC loss w.r.t. the softmax inputs u: (T, C)."""
    log_y = u - np.log(np.exp(u - u.max(1, keepdims=True)).sum(1, keepdims=True)) - u.max(1, keepdims=True)
    la, lb, ext = ctc_alpha_beta(log_y, target, blank)
    logp = -ctc_loss(log_y, target, blank)
    T, C = u.shape
    grad = np.exp(log_y).copy()
    for t in range(T):
        for k in set(ext):
            ss = [s for s in range(len(ext)) if ext[s] == k]
            lse = _lse(*[la[t, s] + lb[t, s] for s in ss])
            grad[t, k] -= np.exp(lse - log_y[t, k] - logp)
    return grad
