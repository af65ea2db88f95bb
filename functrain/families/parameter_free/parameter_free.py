"""Learning-rate-free optimizers: Prodigy, D-Adaptation AdamW, DoG, DoWG, Mechanic and COCOB.

Each estimates its own step size. COCOB's bet is per entry, so
:func:`scale_by_cocob` is a ``LeafStage`` run by functrain's engine. The others
need whole-tree quantities every step (a global distance ``D``, an inner
product of the gradients with the distance travelled, a global gradient norm),
so they are whole-tree transformations: the per-array math is written once per
array, between the global reductions, and every tree, shape and dtype is
checked (named by key path) before any array math. Every ``init`` works from
shapes alone (``jax.eval_shape(opt.init, abstract_params)``): the initial
parameters are kept with array operations, never read as numbers.

Names, arguments, defaults, states and numbers are optax.contrib 0.2.8's.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain.arg_checks import (check_betas, check_hyperparameter, check_nonnegative, check_range,
                                  check_state_type, needs_params_error)
from functrain.declarations import declare_optimizer, hyperparameters
from functrain import tree as ft
from functrain.numerics import ema_update, safe_int32_increment, sum_of_products
from functrain.engine.protocol import (GradientTransformation, GradientTransformationExtraArgs,
                                       MaskOrFn, Params, ScalarOrSchedule, Updates)
from functrain.engine.stage import as_array
from functrain.engine.counts import value_at
from functrain.engine.program import chain, identity, leaf_compute_dtype
from functrain.transforms.scaling import add_decayed_weights, scale_by_learning_rate

Array = jax.Array
def _copy(tree: Params) -> Params:
    """A copy of every leaf (distinct buffers; traced fine by ``jax.eval_shape``)."""
    return jax.tree_util.tree_map(lambda p: jnp.array(p, copy=True), tree)


def _check_init(owner: str, params: Params, real_only: bool) -> Any:
    """Check the params' dtypes (naming the leaf); their lowest dtype, for the scalar state."""
    paths, leaves, _ = ft.flatten_with_paths(params)
    ft.check_leaf_dtypes(paths, leaves, [True] * len(leaves), owner, "params",
                         real_only=real_only)
    return ft.dtype(params, "lowest")


def _checked_leaves(owner: str, updates: Updates, params: Optional[Params], fields: dict,
                    real_only: bool) -> tuple:
    """The leaves of ``updates``, ``params`` and each state field, checked before any math.

    Returns ``(gs, ps, treedef, {name: leaves})``; raises naming the key path
    (or the missing params) when the trees, shapes or dtypes do not fit.
    """
    if params is None:
        raise needs_params_error(owner)
    paths, gs, treedef = ft.flatten_with_paths(updates)
    ft.check_structure(updates, params, "params", "updates")
    gs = [as_array(g) for g in gs]
    ps = [as_array(p) for p in treedef.flatten_up_to(params)]
    ft.check_shapes(paths, ps, gs, "updates", "params")
    for what, leaves in (("updates", gs), ("params", ps)):
        ft.check_leaf_dtypes(paths, leaves, [True] * len(gs), owner, what, real_only=real_only)
    out = {}
    for name, tree in fields.items():
        leaves = ft.flatten_like(treedef, tree, f"{owner} state .{name}", updates, "updates")
        ft.check_shapes(paths, leaves, gs, "updates", f"{owner} state .{name}")
        out[name] = leaves
    return gs, ps, treedef, out


def _in(cd: Any, *xs: Array) -> list:
    return [x.astype(cd) for x in xs]


def _like(xs: list, olds: list) -> list:
    return [x.astype(o.dtype) for x, o in zip(xs, olds)]


# --------------------------------------------------------------------------
# Prodigy and D-Adaptation AdamW
# --------------------------------------------------------------------------

class ProdigyState(NamedTuple):
    """State of :func:`prodigy` (optax's fields and order).

    Attributes:
      exp_avg: first moment of ``d g`` (a tree like the params).
      exp_avg_sq: second moment of ``d g``.
      grad_sum: the weighted sum of past ``d g`` (its L1 norm is the
        denominator of the ``d`` estimate).
      params0: the initial parameters ``x_0``.
      estim_lr: the current estimate ``d`` of the distance to the solution.
      numerator_weighted: the weighted sum of ``<g_k, x_0 - x_k>``.
      count: the step count (int32).

    >>> import jax.numpy as jnp, functrain
    >>> functrain.contrib.prodigy().init(jnp.ones(2)).estim_lr
    Array(1.e-06, dtype=float32)
    """

    exp_avg: Any
    exp_avg_sq: Any
    grad_sum: Any
    params0: Any
    estim_lr: Any
    numerator_weighted: Any
    count: Any


@declare_optimizer("contrib", "Mishchenko & Defazio, 2023", optax="contrib", summary=(
    "Learning-rate-free Adam (Mishchenko & Defazio, 2023; Defazio & Mishchenko, 2023): the step "
    "size is estimated from the distance travelled."), signature="prodigy(learning_rate=1.0, ...)")
@hyperparameters(learning_rate="schedule", beta3="number or None", eps="number",
                 estim_lr0="number", estim_lr_coef="number", weight_decay="number")
def prodigy(learning_rate: ScalarOrSchedule = 1.0, betas: tuple[float, float] = (0.9, 0.999),
            beta3: Optional[float] = None, eps: float = 1e-8, estim_lr0: float = 1e-6,
            estim_lr_coef: float = 1.0, weight_decay: float = 0.0,
            safeguard_warmup: bool = False) -> GradientTransformationExtraArgs:
    """Prodigy (Mishchenko & Defazio, 2023): AdamW whose step size estimates the distance to the solution.

    With ``d`` the estimate (``estim_lr``, from ``estim_lr0``), ``lr_t`` the
    schedule, ``dlr = d lr_t sqrt(1 - b2^t) / (1 - b1^t)``, per step::

        m = b1 m + (1 - b1) d g;   v = b2 v + (1 - b2) (d g)^2
        s = b3 s + (dlr / d0) d g          (d instead of dlr with safeguard_warmup)
        r = b3 r + (d / d0) dlr <g, x_0 - x>
        d = max(d, estim_lr_coef r / ||s||_1)
        update = -weight_decay dlr x - dlr m / (sqrt(v) + d eps)

    (``d0 = estim_lr0``; the update uses the new ``d``). Paper: Mishchenko and
    Defazio, "Prodigy: An Expeditiously Adaptive Parameter-Free Learner"
    (2023). Real parameters only (complex leaves raise a ``TypeError`` naming
    the leaf).

    Args:
      learning_rate: a multiplier of the estimated step (number or schedule;
        e.g. a warmup then decay from 1.0).
      betas: ``(b1, b2)``, the AdamW decay rates, each in ``[0, 1)``.
      beta3: decay of the ``d`` estimate's sums; ``None`` for ``sqrt(b2)``.
      eps: added to the root of the second moment (times ``d``), ``>= 0``.
      estim_lr0: the initial (under-)estimate ``d0`` of ``d``, ``> 0``.
      estim_lr_coef: multiplies every new estimate of ``d``.
      weight_decay: AdamW-style (decoupled) weight decay, ``>= 0``.
      safeguard_warmup: leave the learning rate out of ``s`` (helps during a
        warmup).

    Returns:
      A ``GradientTransformationExtraArgs`` whose ``update`` needs the params
      (extra keywords are ignored) and whose state is :class:`ProdigyState`.

    >>> import jax, jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.prodigy()
    >>> params = jnp.array([1., 2., 3.])
    >>> state = opt.init(params)
    >>> for _ in range(10):
    ...     updates, state = opt.update(jax.grad(lambda x: jnp.sum(x ** 2))(params), state, params)
    ...     params = functrain.apply_updates(params, updates)
    >>> print(f"{float(state.estim_lr):.3g}")
    1.65e-05
    """
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
        raise TypeError(f"prodigy: betas must be a pair (b1, b2), got {betas!r}.")
    beta1, beta2 = betas
    check_betas("prodigy", b1=beta1, b2=beta2)
    beta3 = beta2 ** 0.5 if beta3 is None else beta3
    check_betas("prodigy", beta3=beta3)
    check_nonnegative("prodigy", eps=eps, weight_decay=weight_decay)
    check_range("estim_lr0", estim_lr0, 1e-45, owner="prodigy")

    def init_fn(params: Params) -> ProdigyState:
        dtype = _check_init("prodigy", params, real_only=True)
        return ProdigyState(ft.zeros_like(params), ft.zeros_like(params), ft.zeros_like(params),
                            _copy(params), jnp.asarray(estim_lr0, dtype), jnp.zeros((), dtype),
                            jnp.zeros((), jnp.int32))

    def update_fn(updates: Updates, state: ProdigyState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, ProdigyState]:
        del extra_args
        check_state_type(state, ProdigyState, "prodigy")
        gs, ps, treedef, f = _checked_leaves(
            "prodigy", updates, params, {"exp_avg": state.exp_avg, "exp_avg_sq":
                                         state.exp_avg_sq, "grad_sum": state.grad_sum,
                                         "params0": state.params0}, real_only=True)
        count = safe_int32_increment(state.count)
        sched = value_at(learning_rate, state.count)
        d = state.estim_lr
        # associated as optax associates them (the same numbers, optax's bits)
        dlr = jnp.asarray(d * sched * ((1 - beta2 ** count) ** 0.5 / (1 - beta1 ** count)),
                          d.dtype)
        s_rate = d if safeguard_warmup else dlr
        moments, diffs, rows = [], [], zip(gs, ps, f["exp_avg"], f["exp_avg_sq"],
                                           f["grad_sum"], f["params0"])
        for g, p, m, v, s, p0 in rows:
            g, p, m, v, s, p0 = _in(leaf_compute_dtype(g, p), g, p, m, v, s, p0)
            dg = d * g
            moments.append((ema_update(dg, m, beta1), beta2 * v + (1 - beta2) * dg * dg,
                            beta3 * s + s_rate * dg / estim_lr0))
            diffs.append((g, p0 - p))
        numerator = beta3 * state.numerator_weighted + (d / estim_lr0) * dlr * sum_of_products(
            [g for g, _ in diffs], [x for _, x in diffs])
        denominator = ft.norm([s for _, _, s in moments], ord=1)
        new_d = jnp.maximum(d, estim_lr_coef * numerator / denominator).astype(d.dtype)
        out = [(-weight_decay * dlr * p.astype(m.dtype) - dlr * m / (jnp.sqrt(v) + new_d * eps)
                ).astype(g.dtype) for (m, v, _), g, p in zip(moments, gs, ps)]
        new = [treedef.unflatten(_like([mv[i] for mv in moments], f[k]))
               for i, k in enumerate(("exp_avg", "exp_avg_sq", "grad_sum"))]
        return treedef.unflatten(out), ProdigyState(
            *new, state.params0, new_d, numerator.astype(state.numerator_weighted.dtype), count)

    return GradientTransformationExtraArgs(init_fn, update_fn)


class DAdaptAdamWState(NamedTuple):
    """State of :func:`dadapt_adamw` (optax's fields and order).

    Attributes:
      exp_avg: first moment of ``dlr g`` (a tree like the params).
      exp_avg_sq: second moment of ``g``.
      grad_sum: the weighted sum of past ``dlr g``.
      estim_lr: the current estimate ``d`` of the distance to the solution.
      numerator_weighted: the weighted sum of ``dlr <g, s / (sqrt(v) + eps)>``.
      count: the step count (int32).

    >>> import jax.numpy as jnp, functrain
    >>> functrain.contrib.dadapt_adamw().init(jnp.ones(2)).count
    Array(0, dtype=int32)
    """

    exp_avg: Any
    exp_avg_sq: Any
    grad_sum: Any
    estim_lr: Any
    numerator_weighted: Any
    count: Any


@declare_optimizer("contrib", "Defazio & Mishchenko, 2023", optax="contrib", listed_with="prodigy",
    signature="dadapt_adamw(learning_rate=1.0, ...)")
@hyperparameters(learning_rate="schedule", eps="number", estim_lr0="number",
                 weight_decay="number")
def dadapt_adamw(learning_rate: ScalarOrSchedule = 1.0,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 estim_lr0: float = 1e-6, weight_decay: float = 0.0
                 ) -> GradientTransformationExtraArgs:
    """D-Adaptation AdamW (Defazio & Mishchenko, 2023): AdamW with a learned step size.

    With ``d`` the estimate (from ``estim_lr0``), ``lr_t`` the schedule,
    ``dlr = d lr_t sqrt(1 - b2^t) / (1 - b1^t)`` and ``c = sqrt(b2)``, per step
    (``s`` and ``v`` on the right are the previous values)::

        r = c r + (1 - c) dlr <g, s / (sqrt(v) + eps)>
        m = b1 m + (1 - b1) dlr g;   v = b2 v + (1 - b2) g^2
        s = c s + (1 - c) dlr g
        d = max(d, r / ((1 - c) ||s||_1))          (used from the next step)
        update = -weight_decay dlr x - m / (sqrt(v) + eps)

    Paper: Defazio and Mishchenko, "Learning-Rate-Free Learning by
    D-Adaptation" (2023). Real parameters only (complex leaves raise a
    ``TypeError`` naming the leaf).

    Args:
      learning_rate: a multiplier of the estimated step (number or schedule).
      betas: ``(b1, b2)``, the AdamW decay rates, each in ``[0, 1)``.
      eps: added to the root of the second moment, ``>= 0``.
      estim_lr0: the initial (under-)estimate of ``d``, ``> 0``.
      weight_decay: AdamW-style (decoupled) weight decay, ``>= 0``.

    Returns:
      A ``GradientTransformationExtraArgs`` whose ``update`` needs the params
      (extra keywords are ignored) and whose state is :class:`DAdaptAdamWState`.

    >>> import jax, jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.dadapt_adamw()
    >>> params = jnp.array([1., 2., 3.])
    >>> state = opt.init(params)
    >>> for _ in range(3):
    ...     updates, state = opt.update(jax.grad(lambda x: jnp.sum(x ** 2))(params), state, params)
    ...     params = functrain.apply_updates(params, updates)
    >>> print(f"{float(state.estim_lr):.3g}")
    9.19e-06
    """
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
        raise TypeError(f"dadapt_adamw: betas must be a pair (b1, b2), got {betas!r}.")
    beta1, beta2 = betas
    check_betas("dadapt_adamw", b1=beta1, b2=beta2)
    check_nonnegative("dadapt_adamw", eps=eps, weight_decay=weight_decay)
    check_range("estim_lr0", estim_lr0, 1e-45, owner="dadapt_adamw")
    c = beta2 ** 0.5

    def init_fn(params: Params) -> DAdaptAdamWState:
        dtype = _check_init("dadapt_adamw", params, real_only=True)
        return DAdaptAdamWState(ft.zeros_like(params), ft.zeros_like(params),
                                ft.zeros_like(params), jnp.asarray(estim_lr0, dtype),
                                jnp.zeros((), dtype), jnp.zeros((), jnp.int32))

    def update_fn(updates: Updates, state: DAdaptAdamWState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, DAdaptAdamWState]:
        del extra_args
        check_state_type(state, DAdaptAdamWState, "dadapt_adamw")
        gs, ps, treedef, f = _checked_leaves(
            "dadapt_adamw", updates, params, {"exp_avg": state.exp_avg, "exp_avg_sq":
                                              state.exp_avg_sq, "grad_sum": state.grad_sum},
            real_only=True)
        count = safe_int32_increment(state.count)
        sched = value_at(learning_rate, state.count)
        nw = state.numerator_weighted
        # associated as optax associates them (the same numbers, optax's bits)
        dlr = (state.estim_lr * sched * ((1 - beta2 ** count) ** 0.5
                                         / (1 - beta1 ** count))).astype(nw.dtype)
        news, weighted, out = [], [], []
        for g, p, m, v, s in zip(gs, ps, f["exp_avg"], f["exp_avg_sq"], f["grad_sum"]):
            gc, p, m, v, s = _in(leaf_compute_dtype(g, p), g, p, m, v, s)
            weighted.append(s / (jnp.sqrt(v) + eps))
            m = beta1 * m + (1 - beta1) * dlr * gc
            v = beta2 * v + (1 - beta2) * gc * gc   # real leaves only
            news.append((m, v, c * s + (1 - c) * dlr * gc))
            out.append((-weight_decay * dlr * p - m / (jnp.sqrt(v) + eps)).astype(g.dtype))
        numerator = c * nw + (1 - c) * dlr * sum_of_products(gs, weighted)
        l1 = ft.norm([s for _, _, s in news], ord=1)
        new_d = jnp.maximum(state.estim_lr, numerator / ((1 - c) * l1))
        new = [treedef.unflatten(_like([mvs[i] for mvs in news], f[k]))
               for i, k in enumerate(("exp_avg", "exp_avg_sq", "grad_sum"))]
        return treedef.unflatten(out), DAdaptAdamWState(
            *new, new_d.astype(state.estim_lr.dtype), numerator.astype(nw.dtype), count)

    return GradientTransformationExtraArgs(init_fn, update_fn)


# --------------------------------------------------------------------------
# DoG and DoWG: distance travelled over the gradients
# --------------------------------------------------------------------------

InitStep = tuple[Literal["distance", "learning_rate", "heuristic"], float]


class DoGState(NamedTuple):
    """State of :func:`scale_by_dog` (and of :func:`dog`'s middle stage), optax's fields.

    Attributes:
      is_init_step: ``True`` until the first update (bool).
      init_params: the initial parameters ``x_0``.
      max_dist: the largest distance ``max_k ||x_k - x_0||`` so far (starting at
        ``r_eps``), in the parameters' lowest dtype.
      sum_sq_norm_grads: the sum of the squared global gradient norms.

    >>> import jax.numpy as jnp, functrain
    >>> state = functrain.contrib.dog(init_step=('distance', 0.5)).init(jnp.ones(2))
    >>> state[1].max_dist
    Array(0.5, dtype=float32)
    """

    is_init_step: Any
    init_params: Any
    max_dist: Any
    sum_sq_norm_grads: Any


def _check_init_step(owner: str, init_step: Any) -> tuple[str, Any]:
    kinds = ("distance", "learning_rate", "heuristic")
    if not (isinstance(init_step, (tuple, list)) and len(init_step) == 2
            and init_step[0] in kinds):
        raise ValueError(f"{owner}: init_step must be a pair (kind, value) with kind one of "
                         f"{kinds}, got {init_step!r}.")
    check_hyperparameter(owner, "init_step value", init_step[1])
    return init_step[0], init_step[1]


def _distance_sq(init_params: list, ps: list) -> Array:
    """``||x - x_0||^2`` over all leaves (real, also for complex leaves)."""
    return ft.norm([p0.astype(leaf_compute_dtype(p, p0)) - p for p0, p in zip(init_params, ps)],
                   squared=True)


def _scaled(treedef: Any, gs: list, rate: Array) -> Updates:
    return treedef.unflatten([(rate * g).astype(g.dtype) for g in gs])


@hyperparameters(eps="number")
def scale_by_dog(init_step: InitStep, eps: float = 1e-8) -> GradientTransformation:
    """Scale by Distance over Gradients (Ivgi et al., 2023): ``max_k ||x_k - x_0|| / sqrt(sum ||g_k||^2)``.

    ``r = max(r, ||x - x_0||)`` (from ``r_eps``), ``G = G + ||g||^2`` (global
    norms over the whole tree) and the update is ``r / sqrt(G + eps) * g``
    (the first update is ``value * g`` for ``init_step=('learning_rate',
    value)``). Paper: Ivgi, Hinder and Carmon, "DoG is SGD's Best Friend: A
    Parameter-Free Dynamic Step Size Schedule" (2023). Complex leaves use
    ``|.|`` norms (optax's numbers).

    Args:
      init_step: ``(kind, value)``: ``('distance', r)`` starts at ``r_eps = r``;
        ``('heuristic', a)`` at ``r_eps = a (1 + ||x_0||)``;
        ``('learning_rate', lr)`` takes a first step of size ``lr``.
      eps: added to the sum of squared gradient norms, ``>= 0``.

    Returns:
      A ``GradientTransformation`` whose ``update`` needs the params and whose
      state is :class:`DoGState`.

    >>> import jax.numpy as jnp, functrain
    >>> from functrain.families.parameter_free.parameter_free import scale_by_dog
    >>> tx = scale_by_dog(('distance', 2.0), eps=0.0)
    >>> params = jnp.array([1.0])
    >>> tx.update(jnp.array([4.0]), tx.init(params), params)[0]
    Array([2.], dtype=float32)
    """
    kind, value = _check_init_step("scale_by_dog", init_step)
    check_nonnegative("scale_by_dog", eps=eps)

    def init_fn(params: Params) -> DoGState:
        dtype = _check_init("scale_by_dog", params, real_only=False)
        r_eps = {"distance": value, "learning_rate": 0.0}.get(kind)
        if kind == "heuristic":
            r_eps = value * (1 + ft.norm(params))
        return DoGState(jnp.asarray(True), _copy(params), jnp.asarray(r_eps, dtype),
                        jnp.asarray(0.0, dtype))

    def update_fn(updates: Updates, state: DoGState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, DoGState]:
        del extra_args
        check_state_type(state, DoGState, "scale_by_dog")
        gs, ps, treedef, f = _checked_leaves("scale_by_dog", updates, params,
                                             {"init_params": state.init_params}, False)
        max_dist = jnp.maximum(jnp.real(state.max_dist),
                               jnp.sqrt(_distance_sq(f["init_params"], ps)))
        sum_sq = jnp.real(state.sum_sq_norm_grads) + ft.norm(gs, squared=True)
        rate = max_dist / jnp.sqrt(sum_sq + eps)
        if kind == "learning_rate":
            rate = jnp.where(state.is_init_step, value, rate)
        return _scaled(treedef, gs, rate), DoGState(
            jnp.asarray(False), state.init_params, max_dist.astype(state.max_dist.dtype),
            sum_sq.astype(state.sum_sq_norm_grads.dtype))

    return GradientTransformation(init_fn, update_fn)


def _decay_stage(weight_decay: Optional[Any], mask: Optional[MaskOrFn]) -> GradientTransformation:
    return identity() if weight_decay is None else add_decayed_weights(weight_decay, mask)


@declare_optimizer("contrib", "Ivgi et al., 2023", optax="contrib", summary=(
    "Distance over gradients (Ivgi et al., 2023; Khaled et al., 2023): parameter-free SGD step "
    "sizes."), signature="dog(learning_rate=1.0, ...)")
@hyperparameters(learning_rate="schedule", eps="number", weight_decay="number or None")
def dog(learning_rate: ScalarOrSchedule = 1.0, init_step: InitStep = ("heuristic", 1e-6),
        eps: float = 1e-8, weight_decay: Optional[float] = None,
        mask: Optional[MaskOrFn] = None) -> GradientTransformationExtraArgs:
    """DoG, Distance over Gradients (Ivgi et al., 2023): SGD with a parameter-free step size.

    ``r_t = max(r_eps, max_{k<=t} ||x_k - x_0||)``, ``G_t = sum_{k<=t} ||g_k||^2``,
    ``x_{t+1} = x_t - lr_t r_t / sqrt(G_t + eps) g_t``, where ``g`` includes
    the weight decay (if any) and the norms are global. The authors recommend
    averaging the iterates. Paper: Ivgi, Hinder and Carmon, "DoG is SGD's Best
    Friend: A Parameter-Free Dynamic Step Size Schedule" (2023).

    Args:
      learning_rate: a multiplier of DoG's step (number or schedule).
      init_step: ``(kind, value)``, see :func:`scale_by_dog`; the default
        ``('heuristic', 1e-6)`` starts at ``r_eps = 1e-6 (1 + ||x_0||)`` (1e-4
        is suggested for models with batch normalization).
      eps: added to the sum of squared gradient norms, ``>= 0``.
      weight_decay: added to the gradients (``g + weight_decay x``) before
        DoG, or ``None`` for none.
      mask: where to add the weight decay (a tree of bools or a function of
        the params), as :func:`functrain.add_decayed_weights`.

    Returns:
      A ``GradientTransformationExtraArgs`` (a chain: weight decay or
      identity, :class:`DoGState`, the learning rate) whose ``update`` needs
      the params.

    >>> import jax, jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.dog(init_step=('distance', 0.1))
    >>> params = jnp.array([1., 2., 3.])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jax.grad(lambda x: jnp.sum(x ** 2))(params), state, params)
    >>> functrain.apply_updates(params, updates)
    Array([0.9732739, 1.9465477, 2.9198217], dtype=float32)
    """
    return chain(_decay_stage(weight_decay, mask), scale_by_dog(init_step, eps),
                 scale_by_learning_rate(learning_rate))


class DoWGState(NamedTuple):
    """State of :func:`scale_by_dowg` (and of :func:`dowg`'s middle stage), optax's fields.

    Attributes:
      init_params: the initial parameters ``x_0``.
      weighted_sq_norm_grads: ``sum_k r_k^2 ||g_k||^2``.
      estim_sq_dist: the largest squared distance ``r^2 = max_k ||x_k - x_0||^2``
        so far (starting at ``init_estim_sq_dist``, or ``eps``).

    >>> import jax.numpy as jnp, functrain
    >>> functrain.contrib.dowg().init(jnp.ones(2))[1].estim_sq_dist
    Array(1.e-04, dtype=float32)
    """

    init_params: Any
    weighted_sq_norm_grads: Any
    estim_sq_dist: Any


@hyperparameters(init_estim_sq_dist="number or None", eps="number")
def scale_by_dowg(init_estim_sq_dist: Optional[float] = None, eps: float = 1e-4
                  ) -> GradientTransformation:
    """Scale by Distance over Weighted Gradients (Khaled et al., 2023).

    ``r^2 = max(r^2, ||x - x_0||^2)``, ``v = v + r^2 ||g||^2`` (global norms)
    and the update is ``r^2 / (sqrt(v) + eps) * g``. Paper: Khaled, Mishchenko
    and Jin, "DoWG Unleashed: An Efficient Universal Parameter-Free Gradient
    Descent Method" (2023). Complex leaves use ``|.|`` norms (optax's numbers).

    Args:
      init_estim_sq_dist: the initial squared distance ``r^2``; ``None`` for
        ``eps``.
      eps: added to ``sqrt(v)``, ``>= 0`` (and the default initial ``r^2``).

    Returns:
      A ``GradientTransformation`` whose ``update`` needs the params and whose
      state is :class:`DoWGState`.

    >>> import jax.numpy as jnp, functrain
    >>> from functrain.families.parameter_free.parameter_free import scale_by_dowg
    >>> tx = scale_by_dowg(init_estim_sq_dist=4.0, eps=0.0)
    >>> params = jnp.array([1.0])
    >>> tx.update(jnp.array([2.0]), tx.init(params), params)[0]
    Array([1.], dtype=float32)
    """
    check_nonnegative("scale_by_dowg", eps=eps)
    if init_estim_sq_dist is not None:
        check_nonnegative("scale_by_dowg", init_estim_sq_dist=init_estim_sq_dist)
    first = eps if init_estim_sq_dist is None else init_estim_sq_dist

    def init_fn(params: Params) -> DoWGState:
        dtype = _check_init("scale_by_dowg", params, real_only=False)
        return DoWGState(_copy(params), jnp.asarray(0.0, dtype), jnp.asarray(first, dtype))

    def update_fn(updates: Updates, state: DoWGState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, DoWGState]:
        del extra_args
        check_state_type(state, DoWGState, "scale_by_dowg")
        gs, ps, treedef, f = _checked_leaves("scale_by_dowg", updates, params,
                                             {"init_params": state.init_params}, False)
        sq_dist = jnp.maximum(jnp.real(state.estim_sq_dist),
                              _distance_sq(f["init_params"], ps))
        weighted = sq_dist * ft.norm(gs, squared=True) + jnp.real(state.weighted_sq_norm_grads)
        rate = sq_dist / (jnp.sqrt(weighted) + eps)
        return _scaled(treedef, gs, rate), DoWGState(
            state.init_params, weighted.astype(state.weighted_sq_norm_grads.dtype),
            sq_dist.astype(state.estim_sq_dist.dtype))

    return GradientTransformation(init_fn, update_fn)


@declare_optimizer("contrib", "Khaled et al., 2023", optax="contrib", listed_with="dog",
    signature="dowg(learning_rate=1.0, ...)")
@hyperparameters(learning_rate="schedule", init_estim_sq_dist="number or None", eps="number",
                 weight_decay="number or None")
def dowg(learning_rate: ScalarOrSchedule = 1.0, init_estim_sq_dist: Optional[float] = None,
         eps: float = 1e-4, weight_decay: Optional[float] = None,
         mask: Optional[MaskOrFn] = None) -> GradientTransformationExtraArgs:
    """DoWG, Distance over Weighted Gradients (Khaled et al., 2023): parameter-free gradient descent.

    ``r_t^2 = max(r_0^2, max_{k<=t} ||x_k - x_0||^2)``, ``v_t = sum_{k<=t} r_k^2
    ||g_k||^2``, ``x_{t+1} = x_t - lr_t r_t^2 / (sqrt(v_t) + eps) g_t``, where
    ``g`` includes the weight decay (if any) and the norms are global. Paper:
    Khaled, Mishchenko and Jin, "DoWG Unleashed: An Efficient Universal
    Parameter-Free Gradient Descent Method" (2023).

    Args:
      learning_rate: a multiplier of DoWG's step (number or schedule).
      init_estim_sq_dist: the initial squared distance ``r_0^2``; ``None`` for
        ``eps``.
      eps: added to ``sqrt(v)``, ``>= 0``.
      weight_decay: added to the gradients before DoWG, or ``None``.
      mask: where to add the weight decay, as :func:`functrain.add_decayed_weights`.

    Returns:
      A ``GradientTransformationExtraArgs`` (a chain: weight decay or
      identity, :class:`DoWGState`, the learning rate) whose ``update`` needs
      the params.

    >>> import jax, jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.dowg()
    >>> params = jnp.array([1., 2., 3.])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jax.grad(lambda x: jnp.sum(x ** 2))(params), state, params)
    >>> print(f"{float(jnp.sum(functrain.apply_updates(params, updates) ** 2)):.6f}")
    13.925367
    """
    return chain(_decay_stage(weight_decay, mask), scale_by_dowg(init_estim_sq_dist, eps),
                 scale_by_learning_rate(learning_rate))


__all__ = ["DAdaptAdamWState", "DoGState", "DoWGState", "ProdigyState", "dadapt_adamw", "dog",
           "dowg", "prodigy", "scale_by_dog", "scale_by_dowg"]
