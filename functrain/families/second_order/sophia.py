"""Sophia (Liu et al., 2023): clipped momentum preconditioned by a Hessian-diagonal estimate.

``sophia`` divides the bias-corrected momentum by ``max(gamma * h, eps)``, with
``h`` an exponential moving average of a Hessian-diagonal estimate refreshed
every ``update_interval`` steps, and clips the result entry by entry.
``hutchinson_estimator_diag_hessian`` is the default estimate (Sophia-H): the
objective, passed to ``update`` as ``obj_fn=``, is differentiated twice along a
random Rademacher vector.

The estimate differentiates the objective over the whole tree, and its refresh
is a ``jax.lax.cond`` around that, so both are plain transformations; the
per-array math (the moments, the division, the clip) is one function applied
leaf by leaf. Names, arguments, states and numbers are optax 0.2.8's.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain.arg_checks import (MissingArgumentError, check_betas, check_nonnegative, check_range,
                                  check_state_type, check_transformation, needs_params_error)
from functrain.declarations import declare_optimizer, hyperparameters
from functrain import tree as ft
from functrain.numerics import bias_correction_factor, ema_update
from functrain.engine.protocol import (GradientTransformation, GradientTransformationExtraArgs,
                                       MaskOrFn, Params, ScalarOrSchedule, Updates,
                                       with_extra_args_support)
from functrain.engine.counts import safe_increment
from functrain.engine.program import chain
from functrain.transforms.scaling import add_decayed_weights, scale_by_learning_rate
from functrain.docstrings import shared_args

Array = jax.Array

__all__ = ["HutchinsonState", "SophiaState", "hutchinson_estimator_diag_hessian", "sophia"]


class HutchinsonState(NamedTuple):
    """State of :func:`hutchinson_estimator_diag_hessian`: the random key.

    Attributes:
      key: the key (a raw ``jax.random.PRNGKey`` by default), split at every
        estimate.

    >>> import jax.numpy as jnp, functrain
    >>> functrain.contrib.hutchinson_estimator_diag_hessian().init(jnp.ones(2)).key
    Array([0, 0], dtype=uint32)
    """

    key: Array


def hutchinson_estimator_diag_hessian(random_seed: Optional[Array] = None
                                      ) -> GradientTransformationExtraArgs:
    """Hutchinson's estimate of the Hessian diagonal (Hutchinson, 1990).

    ``update(updates, state, params, obj_fn=f)`` ignores ``updates`` and
    returns ``z * (H z)``, with ``H`` the Hessian of ``f`` at ``params`` (a
    Hessian-vector product, ``jax.jvp`` of ``jax.grad(f)``) and ``z`` a random
    Rademacher (+-1) tree, a fresh draw per call: an unbiased, high-variance
    estimate of ``diag(H)``. Reference: Hutchinson, "A stochastic estimator of
    the trace of the influence matrix for Laplacian smoothing splines" (1990).

    Args:
      random_seed: the initial key (a ``jax.random.PRNGKey`` or typed key);
        ``None`` means ``jax.random.PRNGKey(0)``.

    Returns:
      A ``GradientTransformationExtraArgs`` whose state is
      :class:`HutchinsonState`; ``update`` raises ``ValueError`` without
      ``params`` or ``obj_fn``.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.contrib.hutchinson_estimator_diag_hessian()
    >>> params = jnp.array([1., 2.])
    >>> f = lambda x: jnp.sum(3 * x ** 2)   # Hessian 6 I: the estimate is exact
    >>> tx.update(params, tx.init(params), params, obj_fn=f)[0]
    Array([6., 6.], dtype=float32)
    """
    owner = "hutchinson_estimator_diag_hessian"

    def init_fn(params: Params) -> HutchinsonState:
        del params
        return HutchinsonState(jax.random.PRNGKey(0) if random_seed is None else random_seed)

    def update_fn(updates: Updates, state: HutchinsonState, params: Optional[Params] = None,
                  obj_fn: Optional[Callable[[Params], Array]] = None, **extra_args: Any
                  ) -> tuple[Updates, HutchinsonState]:
        del updates, extra_args
        check_state_type(state, HutchinsonState, owner)
        if params is None:
            raise needs_params_error(owner, "update(updates, state, params, "
                                            "obj_fn=loss_of_params)")
        if obj_fn is None:
            raise MissingArgumentError(f"{owner} needs the objective: call update(updates, state, "
                                       f"params, obj_fn=f) with f(params) -> scalar loss.")
        if not callable(obj_fn):
            raise TypeError(f"{owner}: obj_fn must be a function params -> scalar loss, got "
                            f"{type(obj_fn).__name__}.")
        paths, leaves, _ = ft.flatten_with_paths(params)
        ft.check_leaf_dtypes(paths, leaves, [True] * len(leaves), owner, "params",
                             real_only=True)
        key, subkey = jax.random.split(state.key)
        signs = ft.random_like(subkey, params, jax.random.rademacher, dtype=jnp.float32)
        signs = ft.cast(signs, ft.dtype(params, "lowest"))
        hvp = jax.jvp(jax.grad(obj_fn), (params,), (signs,))[1]
        return jax.tree_util.tree_map(lambda h, z: h * z, hvp, signs), HutchinsonState(key)

    return GradientTransformationExtraArgs(init_fn, update_fn)


class SophiaState(NamedTuple):
    """State of :func:`sophia`'s first transformation (optax's fields and order).

    Attributes:
      count: the number of steps taken (int32).
      mu: the momentum, an EMA of the gradients (in ``mu_dtype`` if given).
      nu: the EMA of the Hessian-diagonal estimates.
      hessian_fn_state: the state of ``hessian_diagonal_fn``.

    >>> import jax.numpy as jnp, functrain
    >>> functrain.contrib.sophia(1e-3).init({'w': jnp.ones(2)})[0].count
    Array(0, dtype=int32)
    """

    count: Array
    mu: Updates
    nu: Updates
    hessian_fn_state: Any


def _sophia_leaf(g: Array, mu: Array, nu: Array, b1: Any, correction: Array, gamma: Any,
                 eps: Any, clip_threshold: Optional[Any]) -> tuple[Array, Array]:
    """One leaf: the new momentum, and ``clip(mu_hat / max(gamma nu, eps))``."""
    mu = ema_update(g, mu, b1)
    u = (mu / correction.astype(mu.dtype)) / jnp.maximum(gamma * nu, eps)
    if clip_threshold is not None:
        u = jnp.clip(u, -clip_threshold, clip_threshold)
    return u, mu


def _scale_by_sophia(b1: Any, b2: Any, eps: Any, gamma: Any, clip_threshold: Optional[Any],
                     update_interval: Any, hessian_diagonal_fn: Any, mu_dtype: Optional[Any],
                     verbose: bool, print_win_rate_every_n_steps: Any
                     ) -> GradientTransformationExtraArgs:
    owner = "sophia"
    hessian_fn = with_extra_args_support(hessian_diagonal_fn)

    def init_fn(params: Params) -> SophiaState:
        paths, leaves, _ = ft.flatten_with_paths(params)
        ft.check_leaf_dtypes(paths, leaves, [True] * len(leaves), owner, "params",
                             real_only=True)
        return SophiaState(count=jnp.zeros([], jnp.int32),
                           mu=ft.zeros_like(params, dtype=mu_dtype), nu=ft.zeros_like(params),
                           hessian_fn_state=hessian_fn.init(params))

    def update_fn(updates: Updates, state: SophiaState, params: Optional[Params] = None,
                  **hess_fn_kwargs: Any) -> tuple[Updates, SophiaState]:
        check_state_type(state, SophiaState, owner)
        if params is None:
            raise needs_params_error(owner, "update(updates, state, params, "
                                            "obj_fn=loss_of_params)")
        paths, gs, treedef = ft.flatten_with_paths(updates)
        ft.check_structure(updates, params, "params", "updates")
        ft.check_shapes(paths, treedef.flatten_up_to(params), gs, "updates", "params")
        ft.check_leaf_dtypes(paths, gs, [True] * len(gs), owner, "updates", real_only=True)
        fields = []
        for name in ("mu", "nu"):
            leaves = ft.flatten_like(treedef, getattr(state, name), f"{owner} state .{name}",
                                     updates, "updates")
            ft.check_shapes(paths, leaves, gs, "updates", f"{owner} state .{name}")
            fields.append(leaves)
        count = safe_increment(state.count)
        correction = bias_correction_factor(b1, count)

        out, mus = [], []
        for g, mu, nu in zip(gs, *fields):
            cd = ft.compute_dtype(jnp.promote_types(g.dtype, mu.dtype))
            u, new_mu = _sophia_leaf(g.astype(cd), mu.astype(cd), nu.astype(cd), b1,
                                     correction, gamma, eps, clip_threshold)
            out.append(u.astype(g.dtype))
            mus.append(new_mu.astype(mu.dtype))

        if clip_threshold is not None and verbose:
            kept = sum(jnp.sum(jnp.abs(u) < clip_threshold) for u in out)
            win_rate = kept / max(ft.size(out), 1)
            jax.lax.cond(count % print_win_rate_every_n_steps == 0,
                         lambda: jax.debug.print("Sophia optimizer win rate: {}", win_rate),
                         lambda: None)

        def refresh(hess_state: Any, nu: Updates) -> tuple:
            diag, hess_state = hessian_fn.update(updates, hess_state, params, **hess_fn_kwargs)
            nu = jax.tree_util.tree_map(
                lambda h, n: ema_update(h.astype(n.dtype), n, b2).astype(n.dtype), diag, nu)
            return hess_state, nu

        hess_state, nu = jax.lax.cond(state.count % update_interval == 0, refresh,
                                      lambda h, n: (h, n), state.hessian_fn_state, state.nu)
        return treedef.unflatten(out), SophiaState(count, treedef.unflatten(mus), nu,
                                                   hess_state)

    return GradientTransformationExtraArgs(init_fn, update_fn)


@declare_optimizer("contrib", "Liu et al., 2023", optax="contrib", stressed=True, summary=(
    "Sophia (Liu et al., 2023): clipped Newton steps with a Hutchinson Hessian diagonal; "
    "`update(..., obj_fn=)`."), signature="sophia(learning_rate, ...)")
@hyperparameters(learning_rate="schedule", b1="number", b2="number", eps="number",
                 weight_decay="number", gamma="number", clip_threshold="number or None",
                 update_interval="number", print_win_rate_every_n_steps="number")
@shared_args()
def sophia(learning_rate: ScalarOrSchedule, b1: float = 0.965, b2: float = 0.99,
           eps: float = 1e-8, weight_decay: float = 1e-4,
           weight_decay_mask: Optional[MaskOrFn] = None, gamma: float = 0.01,
           clip_threshold: Optional[float] = 1.0, update_interval: int = 10,
           hessian_diagonal_fn: GradientTransformation = hutchinson_estimator_diag_hessian(),
           mu_dtype: Optional[Any] = None, verbose: bool = False,
           print_win_rate_every_n_steps: int = 0, *,
           cautious_weight_decay: bool = False) -> GradientTransformationExtraArgs:
    """Sophia (Liu et al., 2023): a clipped, Hessian-preconditioned momentum method.

    Call ``update(grads, state, params, obj_fn=f)`` with ``f(params) -> loss``
    (the default Hessian estimate's input; other keywords also go to
    ``hessian_diagonal_fn``). With ``t`` the step (from 1): ``m = b1 m + (1 -
    b1) g``, the direction ``clip(m / (1 - b1**t) / max(gamma h, eps),
    -clip_threshold, clip_threshold)``; before each step whose count is a
    multiple of ``update_interval`` (counting from 0), ``h = b2 h + (1 - b2)
    hhat`` with ``hhat`` the Hessian-diagonal estimate at ``params`` (after the
    direction is taken). Then decoupled weight decay and the learning rate:
    the update is ``-learning_rate * (direction + weight_decay * x)``.
    Reference: Liu, Li, Hall, Liang and Ma, "Sophia: A Scalable Stochastic
    Second-order Optimizer for Language Model Pre-training" (2023).

    Args:
      learning_rate: the step size (a number or a schedule).
      b1: the momentum's decay, in ``[0, 1)``.
      b2: the decay of the Hessian-diagonal average, in ``[0, 1)`` (effectively
        ``1 - (1 - b2) / update_interval`` per step).
      eps: the smallest denominator, ``>= 0``.
      weight_decay: the decoupled weight decay.
      weight_decay_mask: a tree (or prefix) of bools, or a function of the
        params, choosing the leaves that decay.
      gamma: the scale of the Hessian diagonal in the denominator.
      clip_threshold: entries of the direction are clipped to this; ``None``
        for no clipping.
      update_interval: steps between Hessian-diagonal estimates, ``>= 1``.
      hessian_diagonal_fn: the transformation estimating the Hessian diagonal
        (default: :func:`hutchinson_estimator_diag_hessian`, Sophia-H); it
        receives the gradients, the params and ``update``'s extra keywords. Over
        several devices, it must average its estimate across them.
      mu_dtype: the momentum's dtype (``None``: the params').
      verbose: print the share of unclipped entries (the "win rate") every
        ``print_win_rate_every_n_steps`` steps.
      print_win_rate_every_n_steps: how often ``verbose`` prints, ``>= 1`` when
        ``verbose``.
      <shared: cautious_weight_decay>

    Returns:
      A ``GradientTransformationExtraArgs``; its state is a tuple of
      :class:`SophiaState`, the weight decay's and the learning rate's states.

    >>> import jax, jax.numpy as jnp, functrain
    >>> f = lambda x: jnp.sum(x ** 2)
    >>> opt = functrain.contrib.sophia(0.1, weight_decay=0.0)
    >>> params = jnp.array([1., -2.])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jax.grad(f)(params), state, params, obj_fn=f)
    >>> updates   # h = 0 at the first step: the direction is clipped to +-1
    Array([-0.1,  0.1], dtype=float32)
    """
    check_betas("sophia", b1=b1, b2=b2)
    check_nonnegative("sophia", eps=eps)
    check_range("update_interval", update_interval, 1.0, owner="sophia")
    if clip_threshold is not None:
        check_nonnegative("sophia", clip_threshold=clip_threshold)
    check_transformation(hessian_diagonal_fn, "sophia", "hessian_diagonal_fn")
    if verbose and clip_threshold is not None:
        check_range("print_win_rate_every_n_steps", print_win_rate_every_n_steps, 1.0,
                    owner="sophia")
    return chain(
        _scale_by_sophia(b1, b2, eps, gamma, clip_threshold, update_interval,
                         hessian_diagonal_fn, mu_dtype, verbose, print_win_rate_every_n_steps),
        add_decayed_weights(weight_decay, mask=weight_decay_mask, cautious=cautious_weight_decay),
        scale_by_learning_rate(learning_rate))
