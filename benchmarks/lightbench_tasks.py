"""The tasks of ``benchmarks/lightbench.py``: small hard problems in the spirit of HeavyBall's
LightBench, written for functrain (no code of LightBench's).

Each task is a :class:`Task`: initial parameters, a loss of the parameters and a random key
(the key feeds gradient noise, sparsity or a data sample where the task has them), an exact
evaluation loss, a success threshold on it and a step budget. The families follow
LightBench's: analytic functions with curved valleys and saddles, ill-conditioned and badly
scaled quadratics, noisy (Gaussian and heavy-tailed), sparse and delayed gradients, and
small learning problems (matrix factorisation, a teacher-student MLP, parity, a tiny RNN).
Budgets and thresholds are ours, chosen so that a well-tuned optimizer can solve each one on
a 2-core CPU in seconds; they are not LightBench's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Task:
    """One problem: ``loss(params, key)`` is minimised for ``steps`` steps; solved when
    ``evaluate(params) <= target`` at the end (and finite)."""

    name: str
    kind: str                                  # what makes it hard, for the tables
    init: Callable[[], Any]                    # () -> params
    loss: Callable[[Any, jax.Array], jax.Array]
    evaluate: Callable[[Any], jax.Array]
    target: float
    steps: int
    delay: int = 0                             # gradients computed at params `delay` steps old


def _quadratic(dim: int, cond: float, scale: float = 1.0) -> tuple[Callable, jax.Array]:
    lam = jnp.asarray(np.logspace(0, np.log10(cond), dim), jnp.float32)
    return (lambda x: scale * 0.5 * jnp.sum(lam * x ** 2)), lam


def _rosenbrock(p: Any) -> jax.Array:
    x, y = p["xy"][0], p["xy"][1]
    return (1 - x) ** 2 + 100 * (y - x ** 2) ** 2


def _beale(p: Any) -> jax.Array:
    x, y = p["xy"][0], p["xy"][1]
    return ((1.5 - x + x * y) ** 2 + (2.25 - x + x * y ** 2) ** 2
            + (2.625 - x + x * y ** 3) ** 2)


def _rastrigin(p: Any) -> jax.Array:
    x = p["x"]
    return 10 * x.size + jnp.sum(x ** 2 - 10 * jnp.cos(2 * jnp.pi * x))


def _saddle(p: Any) -> jax.Array:
    x, y = p["xy"][0], p["xy"][1]
    return x ** 2 - y ** 2 + y ** 4 / 4          # saddle at 0; minima -1 at y = +-sqrt(2)


def _mlp(params: Any, x: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]


def _mlp_init(key: jax.Array, sizes: tuple[int, int, int], scale: float = 1.0) -> Any:
    k1, k2 = jax.random.split(key)
    d, h, o = sizes
    return {"w1": scale * jax.random.normal(k1, (d, h)) / np.sqrt(d), "b1": jnp.zeros(h),
            "w2": scale * jax.random.normal(k2, (h, o)) / np.sqrt(h), "b2": jnp.zeros(o)}


def _tasks() -> list[Task]:
    tasks = []
    quad, _ = _quadratic(32, 1e4)
    x0 = {"x": jnp.ones(32)}
    tasks.append(Task("quadratic_cond1e4", "ill-conditioned", lambda: x0,
                      lambda p, k: quad(p["x"]), lambda p: quad(p["x"]),
                      1e-6 * float(quad(x0["x"])), 1000))
    tiny, _ = _quadratic(32, 1e2, scale=1e-6)
    tasks.append(Task("quadratic_tiny_scale", "vanishing gradients", lambda: x0,
                      lambda p, k: tiny(p["x"]), lambda p: tiny(p["x"]) / 1e-6,
                      1e-4 * float(tiny(x0["x"]) / 1e-6), 500))
    huge, _ = _quadratic(32, 1e2, scale=1e6)
    tasks.append(Task("quadratic_huge_scale", "exploding gradients", lambda: x0,
                      lambda p, k: huge(p["x"]), lambda p: huge(p["x"]) / 1e6,
                      1e-4 * float(huge(x0["x"]) / 1e6), 500))
    tasks.append(Task("rosenbrock", "curved valley", lambda: {"xy": jnp.array([-1.5, 2.0])},
                      lambda p, k: _rosenbrock(p), _rosenbrock, 1e-6, 1000))
    tasks.append(Task("beale", "flat regions", lambda: {"xy": jnp.array([1.0, 1.0])},
                      lambda p, k: _beale(p), _beale, 1e-4, 2000))
    tasks.append(Task("rastrigin", "many local minima",
                      lambda: {"x": jnp.array([2.2, -1.8, 0.9, 3.1])},
                      lambda p, k: _rastrigin(p), _rastrigin, 1e-2, 2000))
    tasks.append(Task("saddle", "saddle point", lambda: {"xy": jnp.array([0.5, 1e-6])},
                      lambda p, k: _saddle(p), _saddle, -0.99, 500))

    noisy, _ = _quadratic(32, 1e2)
    tasks.append(Task("quadratic_gauss_noise", "noisy gradients", lambda: x0,
                      lambda p, k: noisy(p["x"]) + jnp.sum(
                          0.3 * jax.random.normal(k, (32,)) * p["x"]),
                      lambda p: noisy(p["x"]), 1e-2 * float(noisy(x0["x"])), 1000))
    tasks.append(Task("quadratic_heavy_tail", "heavy-tailed noise", lambda: x0,
                      lambda p, k: noisy(p["x"]) + jnp.sum(
                          0.05 * jax.random.cauchy(k, (32,)) * p["x"]),
                      lambda p: noisy(p["x"]), 1e-2 * float(noisy(x0["x"])), 1000))
    sparse, _ = _quadratic(256, 1e2)
    x256 = {"x": jnp.ones(256)}
    def sparse_loss(p: Any, k: jax.Array) -> jax.Array:
        seen = jax.random.uniform(k, (256,)) < 0.05      # 5% of the coordinates per step
        return sparse(jnp.where(seen, p["x"], jax.lax.stop_gradient(p["x"])))

    tasks.append(Task("quadratic_sparse_grad", "sparse gradients", lambda: x256, sparse_loss,
                      lambda p: sparse(p["x"]), 1e-3 * float(sparse(x256["x"])), 2000))
    tasks.append(Task("quadratic_delayed_grad", "delayed gradients", lambda: x0,
                      lambda p, k: noisy(p["x"]), lambda p: noisy(p["x"]),
                      1e-4 * float(noisy(x0["x"])), 1000, delay=4))

    key = jax.random.PRNGKey(0)
    ku, kv, kt, kx, ks = jax.random.split(key, 5)
    target_m = jax.random.normal(ku, (24, 3)) @ jax.random.normal(kv, (3, 24))
    mf0 = {"u": 0.1 * jax.random.normal(kt, (24, 3)), "v": 0.1 * jax.random.normal(kx, (3, 24))}
    mf = lambda p: jnp.mean((p["u"] @ p["v"] - target_m) ** 2)  # noqa: E731
    tasks.append(Task("matrix_factorization", "matrix-shaped, nonconvex", lambda: mf0,
                      lambda p, k: mf(p), mf, 1e-6 * float(mf(mf0)), 800))

    # W -> A W B with ill-conditioned A and B (condition 100 each): a Kronecker-factored
    # curvature, what Shampoo-like preconditioners model.
    ka, kb, kc = jax.random.split(jax.random.PRNGKey(8), 3)
    def ill(k: jax.Array, n: int) -> jax.Array:
        q, _ = jnp.linalg.qr(jax.random.normal(k, (n, n)))
        return (q * jnp.asarray(np.logspace(0, 1, n), jnp.float32)) @ q.T
    amat, bmat = ill(ka, 16), ill(kb, 16)
    wstar = jax.random.normal(kc, (16, 16))
    kr0 = {"w": jnp.zeros((16, 16))}
    kreg = lambda p: 0.5 * jnp.mean((amat @ (p["w"] - wstar) @ bmat) ** 2)  # noqa: E731
    tasks.append(Task("kronecker_regression", "matrix curvature (cond 1e4)", lambda: kr0,
                      lambda p, k: kreg(p), kreg, 1e-6 * float(kreg(kr0)), 300))

    xs = jax.random.normal(ks, (256, 8))
    teacher = _mlp_init(jax.random.PRNGKey(1), (8, 16, 1), scale=2.0)
    ys = _mlp(teacher, xs)
    student0 = _mlp_init(jax.random.PRNGKey(2), (8, 32, 1))
    reg = lambda p: jnp.mean((_mlp(p, xs) - ys) ** 2)  # noqa: E731
    tasks.append(Task("mlp_teacher_student", "small network", lambda: student0,
                      lambda p, k: reg(p), reg, 1e-3 * float(reg(student0)), 1000))

    bits = jnp.asarray(np.array([[int(b) for b in f"{i:04b}"] for i in range(16)]),
                       jnp.float32) * 2 - 1
    parity = jnp.prod(bits, axis=1, keepdims=True)
    net0 = _mlp_init(jax.random.PRNGKey(3), (4, 32, 1))
    xent = lambda p: jnp.mean(jax.nn.softplus(-parity * _mlp(p, bits)))  # noqa: E731
    tasks.append(Task("parity4", "small network, plateaus", lambda: net0,
                      lambda p, k: xent(p), xent, 0.01, 400))

    seq = jax.random.normal(jax.random.PRNGKey(4), (64, 12, 1))
    rnn0 = {"wx": 0.5 * jax.random.normal(jax.random.PRNGKey(5), (1, 16)),
            "wh": 0.3 * jax.random.normal(jax.random.PRNGKey(6), (16, 16)) / 4,
            "wo": 0.1 * jax.random.normal(jax.random.PRNGKey(7), (16, 1))}

    def rnn_loss(p: Any) -> jax.Array:
        def cell(h: jax.Array, x: jax.Array) -> tuple:
            h = jnp.tanh(x @ p["wx"] + h @ p["wh"])
            return h, None
        h, _ = jax.lax.scan(cell, jnp.zeros((64, 16)), jnp.swapaxes(seq, 0, 1))
        return jnp.mean((h @ p["wo"] - seq[:, 0]) ** 2)  # recall the first input

    tasks.append(Task("rnn_recall_first", "vanishing gradients through time", lambda: rnn0,
                      lambda p, k: rnn_loss(p), rnn_loss, 1e-3 * float(rnn_loss(rnn0)), 600))
    return tasks


TASKS: list[Task] = _tasks()
