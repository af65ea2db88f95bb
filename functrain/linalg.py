"""Linear algebra for optimizers: the dominant eigenpair, and a matrix's inverse p-th root.

``power_iteration`` (on a matrix or a matrix-vector product over pytrees) and
``matrix_inverse_pth_root`` (coupled Newton iterations, as Shampoo uses), with
optax's signatures, defaults and numbers.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import jax
import jax.numpy as jnp
from jax import lax

from functrain import tree as ft

Array = jax.Array
PyTree = Any

__all__ = ["power_iteration", "matrix_inverse_pth_root"]


def _unit(v: PyTree) -> PyTree:
    return ft.scale(1.0 / ft.norm(v), v)


def power_iteration(matrix: Union[Array, Callable[[PyTree], PyTree]], *,
                    v0: Optional[PyTree] = None, num_iters: Any = 100,
                    error_tolerance: Any = 1e-6,
                    precision: lax.Precision = lax.Precision.HIGHEST,
                    key: Optional[Array] = None) -> tuple[Array, PyTree]:
    """The dominant eigenvalue of a matrix and its eigenvector, by power iteration.

    Repeats ``v <- A v / ||A v||`` with the eigenvalue estimate
    ``lambda = <v, A v>`` until ``||A v - lambda v|| / |lambda| < error_tolerance``
    or ``num_iters`` steps (von Mises & Pollaczek-Geiringer, 1929).

    Args:
      matrix: a square ``(n, n)`` array, or a function computing a
        matrix-vector product on pytrees.
      v0: the starting vector (a tree like the function's input); required
        for a function. ``None`` with an array draws it uniformly in [-1, 1].
      num_iters: the most iterations.
      error_tolerance: the relative residual at which to stop.
      precision: the precision of ``matrix @ v`` for an array.
      key: the PRNG key for ``v0``; ``None`` uses ``jax.random.PRNGKey(0)``.

    Returns:
      ``(eigenvalue, eigenvector)``, the eigenvector normalised to unit length.

    Raises:
      ValueError: ``matrix`` is a function and ``v0`` is missing.

    >>> import jax.numpy as jnp
    >>> eig, vec = power_iteration(jnp.diag(jnp.array([1., 3., 2.])))
    >>> print(round(float(eig), 4), jnp.round(jnp.abs(vec), 3))
    3.0 [0. 1. 0.]
    """
    if callable(matrix):
        if v0 is None:
            raise ValueError("v0 must be provided when `matrix` is a callable.")
        mvp = matrix
    else:
        def mvp(v: Array) -> Array:
            return jnp.matmul(matrix, v, precision=precision)
        if v0 is None:
            key = jax.random.PRNGKey(0) if key is None else key
            v0 = jax.random.uniform(key, matrix.shape[-1:], matrix.dtype, -1.0, 1.0)
    v0 = _unit(v0)

    def keep_going(carry: tuple) -> Array:
        v, av, eig, i = carry
        residual = ft.norm(ft.sub(av, ft.scale(eig, v)))
        return ~(jnp.abs(residual / eig) < error_tolerance) & (i < num_iters)

    def step(carry: tuple) -> tuple:
        _, av, _, i = carry
        v = _unit(av)
        av = mvp(v)
        return v, av, ft.vdot(v, av), i + 1

    _, av, eig, _ = lax.while_loop(keep_going, step,
                                   (v0, mvp(v0), jnp.asarray(0.0), jnp.asarray(0)))
    return eig, _unit(av)


def _power_of_two_power(m: Array, p: Any, precision: lax.Precision) -> Array:
    """``m**p`` for ``p`` in 1, 2, 4, 8 (``p`` rounded to the nearest power of two)."""
    def squared_k_times(k: int) -> Callable[[Array], Array]:
        def run(x: Array) -> Array:
            for _ in range(k):
                x = jnp.matmul(x, x, precision=precision)
            return x
        return run

    k = jnp.asarray(jnp.round(jnp.log2(p)), jnp.int32)
    return lax.switch(k, [squared_k_times(j) for j in range(4)], m)


def matrix_inverse_pth_root(matrix: Array, p: Any, num_iters: Any = 100,
                            ridge_epsilon: Any = 1e-6, error_tolerance: Any = 1e-6,
                            precision: lax.Precision = lax.Precision.HIGHEST
                            ) -> tuple[Array, Any]:
    """``matrix**(-1/p)`` of a symmetric positive semi-definite matrix, by coupled Newton iterations.

    The matrix is first damped by ``ridge_epsilon * max(lambda_max, 1e-16)``
    (``lambda_max`` from :func:`power_iteration`). With ``alpha = -1/p`` and
    ``z = (1 + p) / (2 ||A||_F)``, start from ``M = z A``, ``H = z**(1/p) I`` and
    repeat ``T = (1 - alpha) I + alpha M``, ``M <- T**p M``, ``H <- H T``
    while ``max|M - I| > error_tolerance`` and the error does not grow more than
    1.2-fold (Higham, *Functions of Matrices*, 2008, eq. 7.18; as in Shampoo,
    Gupta et al., 2018). The iterations run in float32.

    Args:
      matrix: a symmetric PSD ``(n, n)`` matrix.
      p: the root, a positive integer (1, 2, 4 or 8).
      num_iters: the most iterations.
      ridge_epsilon: the relative damping added to the diagonal.
      error_tolerance: the ``max|M - I|`` at which to stop.
      precision: the precision of the matrix products.

    Returns:
      ``(root, error)``: ``matrix**(-1/p)`` in ``matrix``'s dtype, and the
      final ``max|M - I|`` (``0`` for a 1x1 matrix).

    >>> import jax.numpy as jnp
    >>> root, _ = matrix_inverse_pth_root(jnp.diag(jnp.array([4., 16.])), 2)
    >>> print(jnp.round(jnp.diag(root), 3))
    [0.5  0.25]
    """
    n = matrix.shape[0]
    alpha = jnp.asarray(-1.0 / p, jnp.float32)
    eye = jnp.eye(n, dtype=jnp.float32)
    max_ev, _ = power_iteration(matrix=matrix, num_iters=100, error_tolerance=1e-6,
                                precision=precision)
    ridge = ridge_epsilon * jnp.maximum(max_ev, 1e-16)

    if n == 1:
        return (matrix + ridge) ** alpha, 0

    def keep_going(carry: tuple) -> Array:
        i, _, _, _, err, improving = carry
        return (i < num_iters) & (err > error_tolerance) & improving

    def step(carry: tuple) -> tuple:
        i, m, h, _, err, _ = carry
        t = (1 - alpha) * eye + alpha * m
        new_m = jnp.matmul(_power_of_two_power(t, p, precision), m, precision=precision)
        new_h = jnp.matmul(h, t, precision=precision)
        new_err = jnp.max(jnp.abs(new_m - eye))
        return i + 1, new_m, new_h, h, new_err, new_err < err * 1.2

    damped = matrix + ridge * eye
    z = (1 + p) / (2 * jnp.linalg.norm(damped))
    m0 = damped * z
    h0 = eye * jnp.power(z, 1.0 / p)
    _, m, h, prev_h, _, improving = lax.while_loop(
        keep_going, step, (0, m0, h0, h0, jnp.max(jnp.abs(m0 - eye)), True))
    err = jnp.max(jnp.abs(m - eye))
    ok = jnp.asarray(improving, prev_h.dtype)
    return jnp.asarray(ok * h + (1 - ok) * prev_h, matrix.dtype), err
