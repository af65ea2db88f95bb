"""L-BFGS: the gradient multiplied by a limited-memory inverse-Hessian approximation.

``scale_by_lbfgs`` is whole-tree math (inner products over every leaf, a loop
over the memory of past steps), so it is a plain ``GradientTransformation``
rather than a per-leaf stage. It checks its inputs the way the engine does
(tree structures and shapes, naming the key path at fault) before any array
math, computes 16-bit leaves in float32 and keeps optax's state layout and
numbers. Chain it with a line search (:mod:`functrain.families.quasi_newton.linesearch`);
:func:`functrain.lbfgs` does.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain.arg_checks import check_range, check_state_type, needs_params_error
from functrain.declarations import hyperparameters
from functrain import tree as ft
from functrain.engine.protocol import GradientTransformationExtraArgs, OptState, Params, Updates
from functrain.engine.stage import as_array
from functrain.engine.counts import safe_increment

Array = jax.Array


class ScaleByLBFGSState(NamedTuple):
    """State of :func:`scale_by_lbfgs` (optax's fields, in optax's order).

    Attributes:
      count: the number of steps taken (int32).
      params: the parameters of the previous step.
      updates: the gradients (incoming updates) of the previous step.
      diff_params_memory: the last ``memory_size`` parameter differences
        ``w_{k+1} - w_k``, each leaf stacked as ``(memory_size, *shape)``.
      diff_updates_memory: the matching gradient differences ``u_{k+1} - u_k``.
      weights_memory: ``rho_k = 1 / <du_k, dw_k>`` for each stored pair
        (0 where the inner product is 0), shape ``(memory_size,)``.

    >>> import jax.numpy as jnp
    >>> state = scale_by_lbfgs(memory_size=3).init({'w': jnp.zeros(2)})
    >>> state.diff_params_memory['w'].shape, state.weights_memory.shape
    ((3, 2), (3,))
    """

    count: Array
    params: Any
    updates: Any
    diff_params_memory: Any
    diff_updates_memory: Any
    weights_memory: Array


def _real_vdot(x: list, y: list) -> Array:
    """``Re(sum_i vdot(x_i, y_i))`` over two lists of leaves (``x`` conjugated)."""
    return jnp.real(ft.vdot(x, y))


def _compute(leaves: list, dtypes: list) -> list:
    return [jnp.asarray(x).astype(d) for x, d in zip(leaves, dtypes)]


def _two_loop(q: list, dws: list, dus: list, rhos: Array, gamma: Array, newest: Array) -> list:
    """``P_k q``: Nocedal and Wright's two-loop recursion over the stored pairs.

    ``dws``/``dus`` are the stacked memories (one array per leaf), ``newest``
    the slot the next pair will take, so slots ``newest, newest + 1, ...``
    (mod ``m``) run from the oldest pair to the newest.
    """
    m = rhos.shape[0]
    order = (newest + jnp.arange(m)) % m

    def backward(vec: list, i: Array) -> tuple:
        dw, du = [x[i] for x in dws], [x[i] for x in dus]
        alpha = rhos[i] * _real_vdot(dw, vec)
        return [(v - alpha * d).astype(v.dtype) for v, d in zip(vec, du)], alpha

    q, alphas = jax.lax.scan(backward, q, order, reverse=True)
    q = [(gamma * v).astype(v.dtype) for v in q]

    def forward(vec: list, i_alpha: tuple) -> tuple:
        i, alpha = i_alpha
        dw, du = [x[i] for x in dws], [x[i] for x in dus]
        beta = rhos[i] * _real_vdot(du, vec)
        return [(v + (alpha - beta) * d).astype(v.dtype) for v, d in zip(vec, dw)], beta

    q, _ = jax.lax.scan(forward, q, (order, alphas))
    return q


@hyperparameters(memory_size="int")
def scale_by_lbfgs(memory_size: int = 10,
                   scale_init_precond: bool = True) -> GradientTransformationExtraArgs:
    r"""Multiply the gradient by the L-BFGS approximation of the inverse Hessian.

    L-BFGS (Liu and Nocedal, 1989; Nocedal and Wright, *Numerical Optimization*,
    1999, Algorithms 7.4 and 7.5) keeps the last ``m = memory_size`` pairs
    ``dw_j = w_{j+1} - w_j``, ``du_j = u_{j+1} - u_j`` (params and gradients) and
    returns ``P_k u_k`` with::

        P_{k,j+1} = V_j^T P_{k,j} V_j + rho_j dw_j dw_j^T,   j = k-m .. k-1
        V_j = I - rho_j du_j dw_j^T,   rho_j = 1 / <du_j, dw_j>  (0 if that is 0)
        P_{k,k-m} = gamma_k I,   gamma_k = <du_{k-1}, dw_{k-1}> / |du_{k-1}|^2

    computed by the two-loop recursion. With ``scale_init_precond=False``,
    ``gamma_k = 1``. At the first step ``gamma_0 = min(1, 1 / |u_0|)``: the
    first step is at most of length 1 (optax's choice). The result is an
    ascent direction: follow it with ``scale(-1)`` (or a learning rate) and a
    line search, as :func:`functrain.lbfgs` does. Complex parameters are
    supported (inner products are ``Re <x, y>``).

    The memory is updated from ``params`` and ``updates`` *before* the step, so
    the pair of the step a line search just accepted enters the next update.

    Args:
      memory_size: how many past pairs to keep (at least 1).
      scale_init_precond: start from ``gamma_k I`` (the formula above) instead
        of the identity.

    Returns:
      A :class:`~functrain.engine.protocol.GradientTransformationExtraArgs`
      whose state is :class:`ScaleByLBFGSState`; ``update`` needs ``params``
      and ignores extra keyword arguments.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_lbfgs()
    >>> params = {'w': jnp.array([1., 2.])}
    >>> u, state = tx.update({'w': jnp.array([3., 4.])}, tx.init(params), params)
    >>> u['w']  # the first step is the gradient scaled to norm 1
    Array([0.6, 0.8], dtype=float32)
    """
    check_range("memory_size", memory_size, 1, owner="scale_by_lbfgs")
    m = int(memory_size)

    def init_fn(params: Params) -> ScaleByLBFGSState:
        paths, leaves, treedef = ft.flatten_with_paths(params)
        leaves = [as_array(p) for p in leaves]
        ft.check_leaf_dtypes(paths, leaves, [True] * len(leaves), "scale_by_lbfgs", "params")
        stacked = treedef.unflatten([jnp.zeros((m,) + p.shape, p.dtype) for p in leaves])
        return ScaleByLBFGSState(
            count=jnp.zeros([], jnp.int32),
            params=treedef.unflatten([jnp.zeros_like(p) for p in leaves]),
            updates=treedef.unflatten([jnp.zeros_like(p) for p in leaves]),
            diff_params_memory=stacked,
            diff_updates_memory=jax.tree_util.tree_map(jnp.zeros_like, stacked),
            weights_memory=jnp.zeros(m, jnp.zeros(()).dtype))

    def update_fn(updates: Updates, state: OptState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, ScaleByLBFGSState]:
        del extra_args
        check_state_type(state, ScaleByLBFGSState, "scale_by_lbfgs")
        if params is None:
            raise needs_params_error("scale_by_lbfgs")
        paths, gs, treedef = ft.flatten_with_paths(updates)
        gs = [as_array(g) for g in gs]
        ft.check_structure(updates, params, "params", "updates")
        ps = [as_array(p) for p in treedef.flatten_up_to(params)]
        ft.check_shapes(paths, ps, gs, "updates", "params")
        ft.check_leaf_dtypes(paths, gs, [True] * len(gs), "scale_by_lbfgs", "updates")
        olds = {}
        for name in ("params", "updates", "diff_params_memory", "diff_updates_memory"):
            olds[name] = ft.flatten_like(treedef, getattr(state, name),
                                         f"scale_by_lbfgs state .{name}", updates, "updates")
            stacked = name.startswith("diff")
            expected = [jax.ShapeDtypeStruct(((m,) if stacked else ()) + g.shape, g.dtype)
                        for g in gs]
            ft.check_shapes(paths, olds[name], expected,
                            f"updates (stacked memory_size={m} times)" if stacked
                            else "updates", f"scale_by_lbfgs state .{name}")

        # Every leaf in its compute dtype: the gradient promoted with the parameter,
        # 16-bit floats as float32.
        cds = [ft.compute_dtype(jnp.promote_types(g.dtype, p.dtype)) for g, p in zip(gs, ps)]
        g_c, p_c = _compute(gs, cds), _compute(ps, cds)
        count = state.count
        first = count == 0
        newest, previous = count % m, (count - 1) % m

        # 1. The pair of the last step (zero at the first step) enters the memory.
        dw = [p - q for p, q in zip(p_c, _compute(olds["params"], cds))]
        du = [g - q for g, q in zip(g_c, _compute(olds["updates"], cds))]
        curvature = _real_vdot(du, dw)
        weight = jnp.where(curvature == 0.0, 0.0, 1.0 / curvature)
        dw = [jnp.where(first, jnp.zeros_like(x), x) for x in dw]
        du = [jnp.where(first, jnp.zeros_like(x), x) for x in du]
        weight = jnp.where(first, jnp.zeros_like(weight), weight)
        dws = [mem.astype(c).at[previous].set(x)
               for mem, x, c in zip(olds["diff_params_memory"], dw, cds)]
        dus = [mem.astype(c).at[previous].set(x)
               for mem, x, c in zip(olds["diff_updates_memory"], du, cds)]
        rhos = state.weights_memory.at[previous].set(weight)

        # 2. The scale of the initial preconditioner.
        if scale_init_precond:
            du_sq = ft.norm(du, squared=True)
            gamma = jnp.where(du_sq > 0.0, _real_vdot(du, dw) / du_sq, 1.0)
            capped = jnp.minimum(1.0, 1.0 / ft.norm(jax.lax.stop_gradient(g_c)))
            gamma = jnp.where(count > 0, gamma, capped)
        else:
            gamma = jnp.asarray(1.0)

        # 3. P_k u_k.
        direction = _two_loop(list(g_c), dws, dus, rhos, gamma, newest)

        def stored(new: list, old: list) -> Any:
            return treedef.unflatten([x.astype(o.dtype) for x, o in zip(new, old)])

        new_state = ScaleByLBFGSState(
            count=safe_increment(count),
            params=stored(p_c, olds["params"]),
            updates=stored(g_c, olds["updates"]),
            diff_params_memory=stored(dws, olds["diff_params_memory"]),
            diff_updates_memory=stored(dus, olds["diff_updates_memory"]),
            weights_memory=rhos.astype(state.weights_memory.dtype))
        return stored(direction, gs), new_state

    return GradientTransformationExtraArgs(init_fn, update_fn)


__all__ = ["ScaleByLBFGSState", "scale_by_lbfgs"]
