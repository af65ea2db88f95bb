"""Mechanic (Cutkosky et al., 2023): a learned scale for any base optimizer's updates.

:func:`mechanize` wraps a base optimizer and learns, online, by how much to
multiply the sum of its updates since the start. The scale comes from whole-tree
inner products and norms (the gradient against the distance travelled), so it
is a whole-tree wrapper; every tree, shape and dtype is checked (named by key
path) before any array math, and ``init`` works from shapes alone.

Names, arguments, defaults, state and numbers are optax.contrib 0.2.8's.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain.arg_checks import (check_nonnegative, check_range, check_state_type,
                                  check_transformation, needs_params_error)
from functrain.declarations import declare_optimizer, hyperparameters
from functrain import tree as ft
from functrain.numerics import safe_int32_increment, sum_of_products
from functrain.engine.protocol import (GradientTransformation, GradientTransformationExtraArgs,
                                       OptState, Params, Updates, call_update)
from functrain.engine.stage import as_array
from functrain.engine.program import leaf_compute_dtype

Array = jax.Array


class MechanicState(NamedTuple):
    """State of :func:`mechanize` (optax's fields and order).

    Attributes:
      base_optimizer_state: the wrapped optimizer's state.
      count: the step count (int32).
      r: the per-beta wealth accumulators, shape ``(num_betas,)``.
      m: the per-beta running maxima of ``|h|``.
      v: the per-beta sums of ``h^2``.
      s: the per-beta scales; their sum multiplies the updates.
      x0: the reference parameters (replaced by the params of the first
        update, so weights loaded after ``init`` count).

    >>> import jax.numpy as jnp, functrain
    >>> functrain.contrib.mechanize(functrain.sgd(1.0), num_betas=2).init(jnp.ones(3)).s
    Array([1.e-06, 1.e-06], dtype=float32)
    """

    base_optimizer_state: OptState
    count: Any
    r: Any
    m: Any
    v: Any
    s: Any
    x0: Any


@declare_optimizer("contrib", "Cutkosky et al., 2023", optax="contrib", summary=(
    "Mechanic's learned scale for any optimizer (Cutkosky et al., 2023); COCOB coin betting "
    "(Orabona & Tommasi, 2017)."), signature="mechanize(base_optimizer, ...)")
@hyperparameters(static=("num_betas",), weight_decay="number", eps="number", s_init="number",
                 num_betas="int")
def mechanize(base_optimizer: GradientTransformation, weight_decay: float = 1e-2,
              eps: float = 1e-8, s_init: float = 1e-6, num_betas: int = 6
              ) -> GradientTransformationExtraArgs:
    """Mechanic (Cutkosky et al., 2023): learn the scale of a base optimizer's updates.

    With ``u_t`` the base optimizer's update, ``S = sum(s)`` and ``beta_i = 1 -
    0.1^i`` (``i = 1..num_betas``), per step::

        g'     = g + weight_decay S ||g|| / (||x|| + eps) x
        delta  = (x_0 - x) / (S + eps)                (the sum of past -u)
        h      = <g', delta>
        m_i    = max(beta_i m_i, |h| + eps);   v_i = beta_i^2 v_i + h^2
        r_i    = beta_i r_i + clip(h, -m_i, m_i) s_i   (old m_i, s_i)
        s_i    = (s_init / num_betas m_i + max(r_i, 0)) / (sqrt(v_i) + eps)
        x_new  = x_0 - sum(s) (delta - u_t)

    and the update is ``x_new - x``. Keep the base optimizer's schedule with
    a peak of 1.0: Mechanic learns the scale. Paper: Cutkosky, Defazio and
    Mehta, "Mechanic: A Learning Rate Tuner" (2023). Real parameters only
    (complex leaves raise a ``TypeError`` naming the leaf).

    Args:
      base_optimizer: the optimizer whose updates are scaled (functrain's,
        optax's or any object with ``init`` and ``update``); it receives the
        extra ``update`` keywords it accepts.
      weight_decay: Mechanic's own weight decay on the raw gradients (not the
        base optimizer's), ``>= 0``.
      eps: for numerical stability, ``>= 0``.
      s_init: the initial scale of each beta, ``>= 0``.
      num_betas: how many decay rates ``beta_i = 1 - 0.1^i`` to learn with,
        an int ``>= 1``.

    Returns:
      A ``GradientTransformationExtraArgs`` whose ``update`` needs the params
      and whose state is :class:`MechanicState`.

    >>> import jax, jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.mechanize(functrain.sgd(1.0))
    >>> params = jnp.array([1., 2., 3.])
    >>> state = opt.init(params)
    >>> for _ in range(3):
    ...     updates, state = opt.update(jax.grad(lambda x: jnp.sum(x ** 2))(params), state, params)
    ...     params = functrain.apply_updates(params, updates)
    >>> print(f"{float(jnp.sum(state.s)):.3g}")
    1.35e-06
    """
    check_transformation(base_optimizer, "mechanize", "base_optimizer")
    check_nonnegative("mechanize", weight_decay=weight_decay, eps=eps, s_init=s_init)
    check_range("num_betas", num_betas, 1.0, owner="mechanize")

    def init_fn(params: Params) -> MechanicState:
        paths, leaves, _ = ft.flatten_with_paths(params)
        ft.check_leaf_dtypes(paths, leaves, [True] * len(leaves), "mechanize", "params",
                             real_only=True)
        dtype = ft.dtype(params, "lowest")
        zeros = lambda: jnp.zeros([num_betas], dtype)  # noqa: E731
        return MechanicState(base_optimizer.init(params), jnp.zeros([], jnp.int32), zeros(),
                             zeros(), zeros(), jnp.full([num_betas], s_init, dtype),
                             jax.tree_util.tree_map(lambda p: jnp.array(p, copy=True), params))

    def update_fn(updates: Updates, state: MechanicState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, MechanicState]:
        check_state_type(state, MechanicState, "mechanize")
        if params is None:
            raise needs_params_error("mechanize")
        paths, gs, treedef = ft.flatten_with_paths(updates)
        ft.check_structure(updates, params, "params", "updates")
        gs = [as_array(g) for g in gs]
        ps = [as_array(p) for p in treedef.flatten_up_to(params)]
        x0s = ft.flatten_like(treedef, state.x0, "mechanize state .x0", updates, "updates")
        for name, leaves in (("params", ps), ("mechanize state .x0", x0s)):
            ft.check_shapes(paths, leaves, gs, "updates", name)
        for what, leaves in (("updates", gs), ("params", ps)):
            ft.check_leaf_dtypes(paths, leaves, [True] * len(gs), "mechanize", what,
                                 real_only=True)
        base_updates, base_state = call_update(base_optimizer, updates,
                                               state.base_optimizer_state, params, extra_args)
        us = treedef.flatten_up_to(base_updates)
        first = state.count == 0
        x0s = [jnp.where(first, p, x0) for p, x0 in zip(ps, x0s)]
        s_sum = jnp.sum(state.s)
        decay = weight_decay * s_sum * ft.norm(gs) / (ft.norm(ps) + eps)
        cds = [leaf_compute_dtype(g, p) for g, p in zip(gs, ps)]
        decayed = [g.astype(cd) + decay * p.astype(cd) for g, p, cd in zip(gs, ps, cds)]
        travelled = [(x0.astype(cd) - p) / (s_sum + eps) for x0, p, cd in zip(x0s, ps, cds)]
        h = sum_of_products(decayed, travelled)
        betas = jnp.asarray([1.0 - 0.1 ** i for i in range(1, num_betas + 1)], state.s.dtype)
        m = jnp.maximum(betas * state.m, jnp.abs(h) + eps)
        v = betas ** 2 * state.v + h ** 2
        r = betas * state.r + jnp.clip(h, -state.m, state.m) * state.s
        s = (s_init / num_betas * m + jnp.maximum(r, 0.0)) / (jnp.sqrt(v) + eps)
        total = jnp.sum(s)
        out = [(x0.astype(cd) - total * (d - u) - p).astype(g.dtype)
               for x0, d, u, p, g, cd in zip(x0s, travelled, us, ps, gs, cds)]
        dtype = state.s.dtype
        return treedef.unflatten(out), MechanicState(
            base_state, safe_int32_increment(state.count), r.astype(dtype), m.astype(dtype),
            v.astype(dtype), s.astype(dtype), treedef.unflatten(x0s))

    return GradientTransformationExtraArgs(init_fn, update_fn)


__all__ = ["MechanicState", "mechanize"]
