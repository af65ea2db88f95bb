"""Linear algebra for optimizers: the global norm of a tree, the dominant eigenpair, a matrix's inverse p-th root, and
decompositions over stacks of matrices that cannot deadlock XLA:CPU.

``power_iteration`` (on a matrix or a matrix-vector product over pytrees) and
``matrix_inverse_pth_root`` (coupled Newton iterations, as Shampoo uses), with
optax's signatures, defaults and numbers. ``map_matrices`` runs a LAPACK-backed
decomposition (``eigh``, ``qr``, ``svd``, triangular solves) over a stack of
matrices: one matrix per call on CPU, batched elsewhere (docs/matrix_optimizers.md,
"The Shampoo hang").
"""

from __future__ import annotations

import ctypes
import glob
import math
import os
from typing import Any, Callable, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from functrain import jax_compat, tree as ft

Array = jax.Array
PyTree = Any

__all__ = ["global_norm", "power_iteration", "matrix_inverse_pth_root", "newton_schulz",
           "newton_schulz_coefficients", "map_matrices", "map_stacks", "set_lapack_threads"]


def global_norm(updates: PyTree) -> jax.Array:
    """The L2 norm of all leaves together (as optax.global_norm).

    Args:
      updates: any tree of arrays.

    Returns:
      A scalar, at least float32.

    >>> import jax.numpy as jnp
    >>> global_norm({'a': jnp.array([3.]), 'b': jnp.array([4.])})
    Array(5., dtype=float32)
    """
    return ft.norm(updates)


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


#: Newton-Schulz's normalizations before the first step (:func:`newton_schulz`).
PRECONDITIONINGS = ("frobenius", "spectral", "aol", "schatten")
#: How :func:`newton_schulz` runs the steps: on ``X`` (``'standard'``) or on ``X X^H``.
NS_METHODS = ("standard", "gram")
_RESCALE_EPS = 1e-8  # the floor of the AOL and Schatten-4 rescalings (fixed, as in optax)

# Polar Express (Amsel, Persson, Musco & Gower, 2025, arXiv 2505.16932): the paper's optimal
# odd quintics for l = 1e-3, 5 iterations, safety factor 1 + 2e-2 (all but the last), cushion
# 0.02, as modded-nanogpt runs them after dividing by 1.02 ||X||_F. Steps beyond these use the
# quintic they tend to (15/8, -10/8, 3/8), which ends the paper's code's list and repeats.
_POLAR_EXPRESS = ((8.156554524902461, -22.48329292557795, 15.878769915207462),
                  (4.042929935166739, -2.808917465908714, 0.5000178451051316),
                  (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
                  (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
                  (2.3465413258596377, -1.7097828382687081, 0.42323551169305323))
_STEADY_QUINTIC = (15 / 8, -10 / 8, 3 / 8)
#: Named coefficients (:func:`newton_schulz_coefficients`): Jordan et al.'s triple, Dion's
#: (Ahn et al., 2025) and Polar Express's per-step rows.
NS_PRESETS = ("standard", "dion", "polar_express")
_PRESETS = {"standard": ((3.4445, -4.7750, 2.0315), 1.0),
            "dion": (((4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377),
                      (3.7418, -5.5913, 2.3037), (2.8769, -3.1427, 1.2046),
                      (2.8366, -3.0525, 1.2012)), 1.0),
            "polar_express": (_POLAR_EXPRESS, 1.02)}


def newton_schulz_coefficients(name: str, ns_steps: int = 5, *, owner: str = "newton_schulz",
                               arg: str = "coeffs") -> tuple[np.ndarray, float]:
    """A named set of Newton-Schulz coefficients, and the safety factor of its normalization.

    ``'standard'``: Jordan et al.'s ``(3.4445, -4.7750, 2.0315)`` at every step (Muon,
    2024). ``'dion'``: Dion's five per-step rows (Ahn et al., 2025). ``'polar_express'``:
    Polar Express's per-step rows (Amsel, Persson, Musco & Gower, 2025, arXiv 2505.16932),
    as modded-nanogpt uses them: the optimal odd quintics for ``l = 1e-3``, 5 steps, safety
    factor ``1 + 2e-2`` and cushion ``0.02``, run after dividing by ``1.02 ||X||_F`` (plus
    the caller's ``eps``, where modded-nanogpt adds ``1e-6``). With
    ``ns_steps`` below 5 the first ``ns_steps`` rows; above, the steady-state quintic
    ``(15/8, -10/8, 3/8)`` for the extra steps (the last row of the paper's code, repeated
    there; repeating modded-nanogpt's fifth row instead stalls about 8% from 1).

    Args:
      name: ``'standard'``, ``'dion'`` or ``'polar_express'``.
      ns_steps: the number of steps (sizes ``'polar_express'``'s rows; needs a Python int).
      owner: the function named in an error.
      arg: the argument named in an error.

    Returns:
      ``(coefficients, safety_factor)``: a ``(3,)`` float64 array used at every step or an
      ``(n, 3)`` one of per-step rows, and the factor the norm is multiplied by before the
      division (``1.02`` for ``'polar_express'``, else ``1.0``).

    >>> rows, safety = newton_schulz_coefficients('polar_express', ns_steps=6)
    >>> rows.shape, safety, rows[-1].tolist()
    ((6, 3), 1.02, [1.875, -1.25, 0.375])
    """
    if not isinstance(name, str) or name not in _PRESETS:
        raise ValueError(f"{owner}: {arg} preset {name!r} is unknown; the presets are "
                         f"{list(NS_PRESETS)} (or pass coefficients: (3,) or (n, 3)).")
    coeffs, safety = _PRESETS[name]
    if name == "polar_express":
        if isinstance(ns_steps, jax.core.Tracer) or int(ns_steps) != ns_steps or ns_steps < 0:
            raise ValueError(f"{owner}: {arg}='polar_express' sizes its per-step rows by "
                             f"ns_steps, which must be a Python int >= 0 (static under "
                             f"inject_hyperparams: static_args=('ns_steps',)); got {ns_steps!r}.")
        steps = int(ns_steps)
        rows = coeffs[:steps] + (_STEADY_QUINTIC,) * (steps - len(coeffs))
        return np.asarray(rows, np.float64).reshape(steps, 3), safety
    return np.asarray(coeffs, np.float64), safety


def _ct(x: Array) -> Array:
    return jnp.conj(jnp.swapaxes(x, -1, -2))


def _quintic(x: Array, a: Array, c: Array) -> Array:
    """``c0 X + (c1 A + c2 A A) X`` with ``A = X X^H`` given (optax's association)."""
    b = c[1] * a + c[2] * a @ a
    return c[0] * x + b @ x


def _ns_step(x: Array, c: Array) -> Array:
    return _quintic(x, x @ _ct(x), c)


def _normalize(x: Array, preconditioning: str, eps: Any, safety: float
               ) -> tuple[Array, Optional[Array]]:
    """``x`` scaled for the first step, and ``X X^H`` when the scaling computed it."""
    if preconditioning in ("frobenius", "spectral"):
        order = "fro" if preconditioning == "frobenius" else 2
        norm = jnp.linalg.norm(x, ord=order, axis=(-2, -1), keepdims=True)
        return x / ((norm if safety == 1.0 else norm * safety) + eps), None
    a = x @ _ct(x)
    if preconditioning == "aol":  # 'almost orthogonal layer' rows (Boissin et al., 2025)
        s = jax.lax.rsqrt(jnp.maximum(jnp.abs(a).sum(axis=-1), _RESCALE_EPS))[..., None]
        return x * s, a * s * jnp.swapaxes(s, -1, -2)
    # Schatten-4 (Grishina et al., 2025): ||X||_S4 = ||X X^H||_F ** (1/2)
    s = jax.lax.rsqrt(jnp.maximum(jnp.linalg.norm(a, ord="fro", axis=(-2, -1), keepdims=True),
                                  _RESCALE_EPS))
    return x * s, a * s ** 2


# Gram Newton-Schulz (method='gram') restarts from X every second step. Dao-AILab restarts
# once, before the third step; in float32 that left Polar Express 20x (5 steps) to 60x (8
# steps) further from the float64 iteration than the standard one on matrices of condition
# number 1e4 (64 x 256); restarting every second step matches the standard iteration's error.
def _gram_pair(x: Array, rows: Array) -> Array:
    """Two steps through ``R = X X^H`` (Gram Newton-Schulz): ``Q`` with ``X_2 = Q X``, then ``Q X``.

    A step with ``Z = b R + c R R`` maps ``X`` to ``(a I + Z) X``, so ``Q <- Q (a I + Z)`` and
    ``R <- (a I + Z) R (a I + Z)`` (polynomials in ``R``: they commute); ``Q`` starts at ``I``.
    """
    (a0, b0, c0), (a1, b1, c1) = rows[0], rows[1]
    r = x @ _ct(x)
    z = b0 * r + c0 * (r @ r)
    q = z + a0 * jnp.eye(r.shape[-1], dtype=r.dtype)
    rz = a0 * r + r @ z
    r = a0 * rz + z @ rz
    return (a1 * q + q @ (b1 * r + c1 * (r @ r))) @ x


def check_ns_dtype(dtype: Any, method: str, owner: str = "newton_schulz",
                   names: tuple[str, str, str] = ("dtype", "method", "x's")) -> None:
    """Raise a ``ValueError`` unless ``dtype`` may be the dtype Newton-Schulz's steps run in.

    ``None`` (the input's dtype) always may; otherwise a floating dtype, with
    ``method='standard'``: in bfloat16 Gram Newton-Schulz's ``R = X X^H`` products lost the
    iteration (singular values up to 2.5 on a 512 x 512 Gaussian matrix with Polar Express's
    coefficients, where float32 gives at most 1.14).

    Args:
      dtype: the dtype asked for, or ``None``.
      method: the Newton-Schulz method asked for (``'standard'`` or ``'gram'``).
      owner: the function named in the error.
      names: how the error names the dtype argument, the method argument and whose dtype
        ``None`` means (``('ns_dtype', 'ns_method', "the updates'")`` for the Muon family).

    Returns:
      ``None``.

    >>> check_ns_dtype('int8', 'standard', 'muon', ('ns_dtype', 'ns_method', "the updates'"))
    Traceback (most recent call last):
    ...
    ValueError: muon: ns_dtype must be a floating dtype (jnp.bfloat16, say) or None, got 'int8'.
    """
    if dtype is None:
        return
    dtype_arg, method_arg, whose = names
    try:
        floating = jnp.issubdtype(dtype, jnp.floating)
    except TypeError:
        floating = False
    if not floating:
        raise ValueError(f"{owner}: {dtype_arg} must be a floating dtype (jnp.bfloat16, say) "
                         f"or None, got {dtype!r}.")
    if method == "gram":
        raise ValueError(f"{owner}: {method_arg}='gram' runs in {whose} dtype only: its "
                         f"R = X X^H products lose the iteration in low precision; use "
                         f"{method_arg}='standard' with {dtype_arg}.")


def newton_schulz(x: Array, coeffs: Any = "standard", ns_steps: Any = 5,
                  preconditioning: str = "frobenius", eps: Any = 1e-8, *,
                  method: str = "standard", safety_factor: Optional[float] = None,
                  dtype: Optional[Any] = None) -> Array:
    """Muon's orthogonalization of each matrix of a ``(..., m, n)`` stack (fastest with ``m <= n``).

    After a normalization (``preconditioning``), each step maps ``X`` to
    ``a X + (b A + c A A) X`` with ``A = X X^H`` (Jordan et al., 2024): the
    singular values are pushed towards 1 and the singular vectors kept, an
    approximation of the polar factor ``U V^H`` of ``X = U S V^H``. The steps run
    in a ``lax.fori_loop`` (or a ``lax.scan`` over per-step coefficients), never
    unrolled, so temporary memory does not grow with ``ns_steps``.

    ``method='gram'`` (Gram Newton-Schulz; Zhang, Amsel, Chen & Dao, 2026, Dao-AILab)
    runs pairs of steps on the ``m x m`` matrix ``R = X X^H``: with ``Z = b R + c R R``,
    ``Q <- Q (a I + Z)`` and ``R <- (a I + Z) R (a I + Z)`` from ``Q = I``, then ``X <- Q X``
    (restarting every second step, where the reference restarts once: in float32 that
    keeps it as close to the exact iteration as the standard one; an odd last step is a
    standard one). The same numbers up to rounding in ``12 m^2 n + 22 m^3`` flops for
    five steps against ``20 m^2 n + 10 m^3``: fewer once ``n > 1.5 m``, ``1.29x`` at
    ``n = 4 m``.

    Args:
      x: a ``(..., m, n)`` array; transpose taller matrices (``m > n``) first for speed.
      coeffs: a preset's name (:func:`newton_schulz_coefficients`: ``'standard'``,
        ``'dion'``, ``'polar_express'``), a triple ``(a, b, c)`` used at every step, or an
        ``(n, 3)`` array of per-step rows (then the iteration runs once per row).
      ns_steps: the number of steps with a triple or a preset (a Python int for
        ``'polar_express'`` and for ``method='gram'``).
      preconditioning: ``'frobenius'`` or ``'spectral'`` (divide by ``safety_factor`` times
        that norm plus ``eps``), ``'aol'`` (Boissin et al., 2025) or ``'schatten'``
        (Schatten-4, Grishina et al., 2025) rescaling.
      eps: added to the norm of the first two normalizations.
      method: ``'standard'`` or ``'gram'`` (above).
      safety_factor: the norm is multiplied by this (``> 0``) before the division;
        ``None``: the preset's (``1.02`` for ``'polar_express'``), else ``1``.
      dtype: the floating dtype the steps run in, after the normalization in ``x``'s
        (``jnp.bfloat16``: the accelerators' fast matmuls, as modded-nanogpt runs Muon);
        ``None``: ``x``'s. Measured on Gaussian matrices from 64 x 256 to 1024 x 4096, five
        steps: in bfloat16 the singular values land in float32's band ([0.66, 1.16] against
        [0.68, 1.14] with the standard coefficients, [0.80, 1.14] against [0.86, 1.14] with
        Polar Express) and the result differs from float32's by 3-9% (relative Frobenius
        norm). Only with ``method='standard'``.

    Returns:
      The stack after the steps, in ``x``'s dtype.

    >>> import jax.numpy as jnp
    >>> x = jnp.array([[[3., 0., 0.], [0., 0.5, 0.]]])
    >>> def singular_values(o):
    ...     return [round(float(v), 2) for v in jnp.linalg.svd(o[0], compute_uv=False)]
    >>> singular_values(newton_schulz(x)), singular_values(newton_schulz(x, 'polar_express'))
    ([1.04, 0.71], [1.12, 1.06])
    >>> singular_values(newton_schulz(x, 'polar_express', ns_steps=7, method='gram'))
    [1.0, 1.0]
    """
    if isinstance(coeffs, str):
        coeffs, preset_safety = newton_schulz_coefficients(coeffs, ns_steps)
    else:
        preset_safety = 1.0
    if preconditioning not in PRECONDITIONINGS:
        raise ValueError(f"newton_schulz: preconditioning must be one of {PRECONDITIONINGS}, "
                         f"got {preconditioning!r}.")
    if method not in NS_METHODS:
        raise ValueError(f"newton_schulz: method must be one of {NS_METHODS}, got {method!r}.")
    safety = preset_safety if safety_factor is None else safety_factor
    if isinstance(safety, bool) or not isinstance(safety, (int, float)) or not safety > 0:
        raise ValueError(f"newton_schulz: safety_factor must be a number > 0 or None, got "
                         f"{safety_factor!r}.")
    if np.ndim(coeffs) not in (1, 2) or np.shape(coeffs)[-1] != 3:
        raise ValueError(f"newton_schulz: coeffs must have shape (3,) or (n, 3) (one row per "
                         f"step), got shape {np.shape(coeffs)}.")
    if jnp.ndim(x) < 2:
        raise ValueError(f"newton_schulz: x must be a matrix or a stack of them (..., m, n), "
                         f"got shape {jnp.shape(x)}.")
    if method == "gram" and np.ndim(coeffs) == 1 and (
            isinstance(ns_steps, jax.core.Tracer) or int(ns_steps) != ns_steps):
        raise ValueError(f"newton_schulz: method='gram' with a coefficient triple needs "
                         f"ns_steps as a Python int, got {ns_steps!r}.")
    check_ns_dtype(dtype, method)
    out_dtype = x.dtype
    x, a0 = _normalize(x, preconditioning, eps, float(safety))
    if dtype is not None:
        x = x.astype(dtype)
        a0 = None if a0 is None else a0.astype(dtype)
    x = _iterate(x, a0, jnp.asarray(coeffs).astype(x.dtype), ns_steps, method)
    return x.astype(out_dtype)


def _iterate(x: Array, a0: Optional[Array], coeffs: Array, ns_steps: Any, method: str
             ) -> Array:
    """:func:`newton_schulz`'s steps on the normalized ``x`` (``a0``: the first step's ``X X^H``
    if the normalization computed it)."""
    if method == "gram":
        rows = coeffs if coeffs.ndim == 2 else jnp.broadcast_to(coeffs, (int(ns_steps), 3))
        pairs = rows.shape[0] // 2  # a scan over pairs of steps; an odd last step as usual
        x = jax.lax.scan(lambda x, c: (_gram_pair(x, c), None), x,
                         rows[:2 * pairs].reshape(pairs, 2, 3))[0]
        return _ns_step(x, rows[-1]) if rows.shape[0] % 2 else x

    def step(i: Array, x: Array, c: Array) -> Array:
        if a0 is None:
            return _ns_step(x, c)
        return jax.lax.cond(i == 0, lambda x, c: _quintic(x, a0, c), _ns_step, x, c)

    if coeffs.ndim == 1:
        return jax.lax.fori_loop(0, ns_steps, lambda i, x: step(i, x, coeffs), x)

    def body(carry: tuple, c: Array) -> tuple:
        i, x = carry
        return (i + 1, step(i, x, c)), None

    return jax.lax.scan(body, (jnp.zeros([], jnp.int32), x), coeffs)[0][1]


def map_matrices(fn: Callable[..., Any], *stacks: Array,
                 mesh: Optional[jax.sharding.Mesh] = None) -> Any:
    """``fn`` applied to each matrix of same-length stacks: one call per matrix on CPU.

    On CPU, jaxlib's LAPACK kernels split a *batched* call (``eigh`` of a
    ``(k, n, n)`` stack, ``qr``, ``svd``, triangular solves) over XLA's
    intra-op thread pool and block the calling thread until every matrix is
    done. When such calls run on the pool's own workers, two of them at once
    (an optimizer's refresh, with or without ``lax.cond``), every worker can
    end up waiting for work queued behind it: the program never returns
    (0% CPU). Here the stack goes through ``lax.map``, so each
    LAPACK call sees a single matrix and runs inline; on GPU and TPU the
    batched call is kept (``lax.platform_dependent`` picks at lowering). The
    numbers are the same either way. See docs/matrix_optimizers.md.

    With ``mesh``, the stacks are split over all of its devices (padded with
    copies of their first matrix to a multiple of the device count): each
    device maps its share, and the results are gathered, as distributed
    Shampoo divides its preconditioner work; the same numbers as one device.

    Args:
      fn: a function of one matrix from each stack (``(n, m)`` arrays) to a
        pytree of arrays.
      *stacks: arrays with the same leading (batch) dimension.
      mesh: a ``jax.sharding.Mesh`` to split the work over, or ``None``.

    Returns:
      ``fn``'s outputs stacked along a new leading axis, as ``jax.vmap(fn)``
      (replicated over ``mesh`` when given).

    >>> import jax.numpy as jnp
    >>> s = jnp.stack([jnp.diag(jnp.array([1., 4.])), jnp.diag(jnp.array([9., 16.]))])
    >>> w, _ = map_matrices(jnp.linalg.eigh, s)
    >>> print(w)
    [[ 1.  4.]
     [ 9. 16.]]
    """
    if not stacks:
        raise TypeError("map_matrices needs at least one stack of matrices.")
    lengths = {x.shape[0] if x.ndim else None for x in stacks}
    if len(lengths) != 1 or None in lengths:
        raise ValueError(f"map_matrices: every stack needs the same leading dimension, got "
                         f"shapes {[tuple(x.shape) for x in stacks]}.")
    if mesh is not None and mesh.size > 1:
        return map_stacks(lambda *xs: map_matrices(fn, *xs), *stacks, mesh=mesh)
    if stacks[0].shape[0] == 1:  # a single matrix: no batched call to split
        return jax.tree.map(lambda y: y[None], fn(*(x[0] for x in stacks)))

    def one_at_a_time(*xs: Array) -> Any:
        return lax.map(lambda args: fn(*args), xs)

    return lax.platform_dependent(*stacks, cpu=one_at_a_time, default=jax.vmap(fn))


#: The matrix optimizers' stacks run in chunks of at most this many float32 bytes, one after
#: another, so that their intermediates exist for one chunk at a time (docs/performance.md).
CHUNK_BYTES = 64 * 2**20


def map_stacks(fn: Callable[..., Any], *stacks: Array,
               mesh: Optional[jax.sharding.Mesh] = None, shared: tuple = (),
               chunk_bytes: Optional[int] = None) -> Any:
    """``fn`` of whole stacks, with the stacks split over ``mesh``'s devices when given.

    ``fn`` must treat the leading axis as a batch (each matrix independently, as a batched
    matmul does). Without a mesh this is ``fn(*stacks)``, or ``fn`` of consecutive chunks
    (``chunk_bytes``), concatenated. With a mesh, the stacks are padded to a multiple of
    the device count with copies of their first matrix, each device runs ``fn`` on its
    share (``jax.shard_map``), and the results are gathered and unpadded: the same numbers
    as one device, each device doing ``1/N`` of the work.

    Args:
      fn: a function of stacks (arrays with the same leading dimension) to a pytree of
        arrays with that leading dimension.
      *stacks: the stacks.
      mesh: a ``jax.sharding.Mesh`` to split the work over, or ``None``.
      shared: arrays every device gets whole, passed to ``fn`` after the stacks (traced
        values such as coefficients held in the optimizer state).
      chunk_bytes: without a mesh, the largest chunk ``fn`` gets at a time, in float32
        bytes of the first stack (``None``: the whole stacks at once).

    Returns:
      ``fn(*stacks, *shared)`` (replicated over ``mesh`` when given).

    >>> import jax.numpy as jnp
    >>> s = jnp.arange(12.).reshape(3, 2, 2)
    >>> print(map_stacks(lambda x: x @ x, s)[2])
    [[154. 171.]
     [190. 211.]]
    """
    if mesh is None or mesh.size == 1:
        k = stacks[0].shape[0]
        matrix = 4 * math.prod(stacks[0].shape[1:])
        per = k if chunk_bytes is None else max(1, chunk_bytes // max(1, matrix))
        if per >= k:
            return fn(*stacks, *shared)
        parts = [fn(*(x[a:a + per] for x in stacks), *shared) for a in range(0, k, per)]
        return jax.tree.map(lambda *ys: jnp.concatenate(ys), *parts)
    k, devices = stacks[0].shape[0], mesh.size
    pad = -k % devices
    if pad:  # copies of the first matrix: valid input for any fn, dropped afterwards
        stacks = tuple(jnp.concatenate([x, jnp.broadcast_to(x[:1], (pad,) + x.shape[1:])])
                       for x in stacks)
    explicit = any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types)

    def place(x: Array, spec: PartitionSpec) -> Array:
        if explicit:  # a mesh with explicit axes: the sharding is part of the type
            return jax_compat.reshard(x, NamedSharding(mesh, spec))
        return lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

    split, whole = PartitionSpec(tuple(mesh.axis_names)), PartitionSpec()
    out = jax_compat.shard_map(fn, mesh=mesh,
                               in_specs=(split,) * len(stacks) + (whole,) * len(shared),
                               out_specs=split)(
        *(place(place(x, whole), split) for x in stacks),
        *(place(jnp.asarray(x), whole) for x in shared))
    return jax.tree.map(lambda y: place(y, PartitionSpec())[:k], out)


_SET_THREADS = ("scipy_openblas_set_num_threads", "scipy_openblas_set_num_threads64_",
                "openblas_set_num_threads", "openblas_set_num_threads64_")
_GET_THREADS = ("scipy_openblas_get_num_threads", "scipy_openblas_get_num_threads64_",
                "openblas_get_num_threads", "openblas_get_num_threads64_")


def _lapack_openblas() -> Optional[ctypes.CDLL]:
    """The OpenBLAS behind jaxlib's CPU LAPACK kernels (SciPy's wheel copy), or ``None``."""
    try:
        import scipy
        import scipy.linalg.cython_lapack  # noqa: F401  (loads the library, as jaxlib does)
    except ImportError:
        return None
    root = os.path.dirname(os.path.dirname(os.path.abspath(scipy.__file__)))
    for path in sorted(glob.glob(os.path.join(root, "scipy.libs", "libscipy_openblas*"))
                       + glob.glob(os.path.join(os.path.dirname(scipy.__file__), ".dylibs",
                                                "libscipy_openblas*"))):
        try:
            return ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0))
        except OSError:
            continue
    return None


def set_lapack_threads(n: int) -> Optional[int]:
    """Set how many threads the OpenBLAS behind JAX's CPU ``eigh``/``qr``/``svd`` may use.

    jaxlib's CPU LAPACK kernels call SciPy's OpenBLAS, whose own thread pool (one thread per
    core by default) busy-waits. Inside an XLA program that pool competes with XLA's
    intra-op threads for the same cores; as soon as the machine has other work (a second
    process, a data loader, a test worker) a step with decompositions slows 50-100 fold,
    which looks like a hang (docs/matrix_optimizers.md). ``set_lapack_threads(1)`` removes
    that slowdown, and one thread was also faster unloaded on the 2-core machine where this
    was measured (Shampoo 67 vs 74 ms per step, SOAP 44 vs 50 ms). It is not set for you: it
    is process-wide (it also applies to ``scipy.linalg``; NumPy's own OpenBLAS is a separate
    copy), and with one thread a *batched* LAPACK call in jitted code (``jnp.linalg.eigh``
    of a stack, outside :func:`map_matrices`) deadlocks XLA:CPU far more readily (10 of 10
    runs of docs/matrix_optimizers.md's reproducer, against 1 of 6 with two threads).
    functrain's optimizers make no batched LAPACK call on CPU.

    Args:
      n: the number of threads, ``>= 1``.

    Returns:
      The previous number of threads, or ``None`` when no such OpenBLAS is loaded (SciPy
      built against MKL or Accelerate, or no SciPy): then nothing is changed.

    >>> previous = set_lapack_threads(1)
    >>> previous is None or set_lapack_threads(previous) == 1  # and back
    True
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"set_lapack_threads: n must be an integer >= 1, got {n!r}.")
    lib = _lapack_openblas()
    setter = next((getattr(lib, f) for f in _SET_THREADS if lib and hasattr(lib, f)), None)
    getter = next((getattr(lib, f) for f in _GET_THREADS if lib and hasattr(lib, f)), None)
    if setter is None or getter is None:
        return None
    getter.restype = ctypes.c_int
    previous = int(getter())
    setter(ctypes.c_int(n))
    return previous

