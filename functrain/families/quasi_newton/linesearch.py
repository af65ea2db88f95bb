"""Line searches: a step size chosen per step by evaluating the objective.

``scale_by_backtracking_linesearch`` (sufficient decrease) and
``scale_by_zoom_linesearch`` (strong Wolfe conditions) scale the incoming direction
by the step size they find. Their ``update(updates, state, params, *, value=,
grad=, value_fn=, **fn_kwargs)`` follows optax's extra-arguments protocol
(``fn_kwargs``: further inputs of ``value_fn``).
:func:`~functrain.families.quasi_newton.value_and_grad_reuse.value_and_grad_from_state`
reuses the value and gradient a search computed at the accepted point. Whole-tree
math, so plain transformations; their loops are ``jax.lax.while_loop`` s over a
fixed carry: a jitted step compiles once and a search stops cleanly at its limit.

With ``verbose=True`` a search that fails says why (``jax.debug.print``, so under
``jit`` too). The zoom search's sentences are the module's ``FLAG_*`` constants,
named as optax's so that code looking for optax's flags in the output finds
functrain's: the same facts (no bracket below ``max_learning_rate``, a bracket
shrunk below ``stepsize_precision``, a step with sufficient decrease only, none
at all, a direction that does not descend), in functrain's words.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain.arg_checks import (MissingArgumentError, check_range, check_state_type,
                                  needs_params_error)
from functrain.declarations import hyperparameters
from functrain import tree as ft
from functrain.engine.protocol import GradientTransformationExtraArgs, OptState, Params, Updates
from functrain.engine.stage import as_array
from functrain.engine.counts import safe_increment

Array = jax.Array


class BacktrackingLinesearchInfo(NamedTuple):
    """What the last backtracking search did (for debugging).

    Attributes:
      num_linesearch_steps: how many trial step sizes were evaluated (int32).
      decrease_error: how far the accepted step misses sufficient decrease
        (0 if it meets it; ``inf`` if the objective was not finite there).

    >>> BacktrackingLinesearchInfo(num_linesearch_steps=2, decrease_error=0.0)
    BacktrackingLinesearchInfo(num_linesearch_steps=2, decrease_error=0.0)
    """

    num_linesearch_steps: Array
    decrease_error: Array


class ScaleByBacktrackingLinesearchState(NamedTuple):
    """State of :func:`scale_by_backtracking_linesearch` (optax's fields).

    Attributes:
      learning_rate: the step size accepted at the last step (the next search
        starts from it times ``increase_factor``).
      value: the objective at the accepted point (``inf`` before the first step).
      grad: its gradient there when built with ``store_grad=True``, else ``None``.
      info: a :class:`BacktrackingLinesearchInfo`.

    >>> import jax.numpy as jnp
    >>> scale_by_backtracking_linesearch(10).init(jnp.zeros(2)).learning_rate
    Array(1., dtype=float32)
    """

    learning_rate: Array
    value: Array
    grad: Optional[Any]
    info: BacktrackingLinesearchInfo


class ZoomLinesearchInfo(NamedTuple):
    """What the last zoom search did (for debugging).

    Attributes:
      num_linesearch_steps: how many trial step sizes were evaluated (int32).
      decrease_error: how far the accepted step misses sufficient decrease
        (0 if it meets it; ``inf`` if the objective was not finite there).
      curvature_error: how far it misses the small-curvature condition (mild:
        the largest step allowed may be too small).

    >>> ZoomLinesearchInfo(3, 0.0, 0.0).num_linesearch_steps
    3
    """

    num_linesearch_steps: Array
    decrease_error: Array
    curvature_error: Array


class ScaleByZoomLinesearchState(NamedTuple):
    """State of :func:`scale_by_zoom_linesearch` (optax's fields).

    Attributes:
      learning_rate: the step size accepted at the last step.
      value: the objective at the accepted point (``inf`` before the first step).
      grad: its gradient there (zeros before the first step).
      info: a :class:`ZoomLinesearchInfo`.

    >>> import jax.numpy as jnp
    >>> scale_by_zoom_linesearch(10).init(jnp.zeros(2)).info.num_linesearch_steps
    Array(0, dtype=int32)
    """

    learning_rate: Array
    value: Array
    grad: Any
    info: ZoomLinesearchInfo


def _scalar_dtype(leaves: list) -> Any:
    """The real dtype of the search's scalars: that of the leaves' math (16-bit as float32)."""
    if not leaves:
        return jnp.zeros(()).dtype
    dtype = jnp.result_type(*[ft.compute_dtype(x.dtype) for x in leaves])
    return jnp.real(jnp.zeros((), dtype)).dtype


def _re_vdot(xs: list, ys: list) -> Array:
    """``Re(sum_i vdot(x_i, y_i))`` (``x`` conjugated), each leaf in its compute dtype."""
    parts = []
    for x, y in zip(xs, ys):
        cd = ft.compute_dtype(jnp.promote_types(x.dtype, y.dtype))
        parts.append(jnp.vdot(x.astype(cd).ravel(), y.astype(cd).ravel()))
    return jnp.real(ft.sum(parts))


def _moved(ws: list, eta: Array, us: list) -> list:
    """``w + eta * u`` per leaf, in the parameter's dtype."""
    out = []
    for w, u in zip(ws, us):
        cd = ft.compute_dtype(jnp.promote_types(w.dtype, u.dtype))
        out.append((w.astype(cd) + eta.astype(cd) * u.astype(cd)).astype(w.dtype))
    return out


def _scaled(eta: Array, us: list) -> list:  # eta * u per leaf, in the update's dtype
    return [(eta.astype(cd) * u.astype(cd)).astype(u.dtype)
            for u, cd in ((u, ft.compute_dtype(u.dtype)) for u in us)]


def _fn_kwargs(owner: str, value_fn: Callable, extra: dict) -> dict:
    """The extra keywords that go to ``value_fn``; any it cannot take is a ``TypeError``."""
    try:
        parameters = inspect.signature(value_fn).parameters
    except (TypeError, ValueError):
        return dict(extra)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(extra)
    unused = sorted(k for k in extra if k not in parameters)
    if unused:
        raise TypeError(f"{owner}: Unexpected keyword arguments {unused} in update: value_fn "
                        f"does not take them (extra keywords of update are value_fn's inputs; "
                        f"value_fn accepts {list(parameters)}).")
    return dict(extra)


def _checked_inputs(owner: str, updates: Updates, params: Optional[Params], value: Any,
                    grad: Any, value_fn: Any) -> tuple:
    """Check a search's ``update`` arguments; return (paths, us, ws, gs, treedef)."""
    needed = {"value": value, "grad": grad, "value_fn": value_fn}
    missing = [k for k, v in needed.items() if v is None]
    if missing:
        raise MissingArgumentError(f"{owner} needs the keyword argument {missing[0]!r}: call "
                                   f"update(updates, state, params, value=..., grad=..., "
                                   f"value_fn=...) with the objective's value and gradient "
                                   f"at params.")
    if not callable(value_fn):
        raise TypeError(f"{owner}: value_fn must be the objective, a function of the "
                        f"params, got {type(value_fn).__name__}.")
    if params is None:
        raise needs_params_error(owner, "update(updates, state, params, ...)")
    paths, us, treedef = ft.flatten_with_paths(updates)
    us = [as_array(u) for u in us]
    ft.check_structure(updates, params, "params", "updates")
    ws = [as_array(w) for w in treedef.flatten_up_to(params)]
    ft.check_shapes(paths, ws, us, "updates", "params")
    ft.check_structure(updates, grad, "grad", "updates")
    gs = [as_array(g) for g in treedef.flatten_up_to(grad)]
    ft.check_shapes(paths, ws, gs, "grad", "params")
    for what, leaves in (("params", ws), ("updates", us), ("grad", gs)):
        ft.check_leaf_dtypes(paths, leaves, [True] * len(leaves), owner, what)
    return paths, us, ws, gs, treedef


def _init_common(params: Params) -> tuple:
    leaves = [as_array(p) for p in ft.leaves(params)]
    dtype = _scalar_dtype(leaves)
    return dtype, jnp.asarray(1.0, dtype), jnp.asarray(jnp.inf, dtype)


@hyperparameters(max_backtracking_steps="number", slope_rtol="number",
                 decrease_factor="number", increase_factor="bound", max_learning_rate="bound",
                 atol="number", rtol="number")
def scale_by_backtracking_linesearch(
        max_backtracking_steps: int, slope_rtol: float = 1e-4, decrease_factor: float = 0.8,
        increase_factor: float = 1.5, max_learning_rate: float = 1.0, atol: float = 0.0,
        rtol: float = 0.0, store_grad: bool = False,
        verbose: bool = False) -> GradientTransformationExtraArgs:
    r"""Scale the direction by a step size found by backtracking (Armijo's condition).

    The search (Armijo, 1966; Vaswani et al., *Painless Stochastic Gradient*,
    2019; Nocedal and Wright, 1999) starts at ``eta = min(increase_factor *
    eta_prev, max_learning_rate)`` and multiplies it by ``decrease_factor``
    until the sufficient-decrease condition holds::

        f(w + eta u) <= (1 + rtol) f(w) + eta * slope_rtol * Re<u, conj(grad)> + atol

    or ``max_backtracking_steps`` reductions were made (``max_backtracking_steps
    + 1`` evaluations at most). The update is ``eta * u``; a step size whose
    objective is not finite becomes 0. ``u`` should be a descent direction
    (e.g. from ``sgd`` without momentum). Complex parameters are supported.

    Args:
      max_backtracking_steps: the most reductions of the step size.
      slope_rtol: the fraction of the predicted decrease to require.
      decrease_factor: the factor of each reduction.
      increase_factor: the first trial is the last accepted step size times
        this (``math.inf``: always start at ``max_learning_rate``).
      max_learning_rate: the largest step size tried.
      atol: absolute slack in the condition.
      rtol: relative slack on ``f(w)`` in the condition.
      store_grad: also store the gradient at the accepted point, for
        :func:`value_and_grad_from_state`.
      verbose: print (``jax.debug.print``) when the search fails.

    Returns:
      A ``GradientTransformationExtraArgs`` whose state is
      :class:`ScaleByBacktrackingLinesearchState`; ``update`` needs ``params``
      and the keywords ``value``, ``grad`` and ``value_fn``; its other keywords
      are passed to ``value_fn``.

    >>> import jax, jax.numpy as jnp, functrain
    >>> f = lambda w: jnp.sum(w ** 2)
    >>> opt = functrain.chain(functrain.sgd(1.0),
    ...                       scale_by_backtracking_linesearch(max_backtracking_steps=15))
    >>> w = jnp.array([1., 2., 3.])
    >>> state = opt.init(w)
    >>> value, grad = jax.value_and_grad(f)(w)
    >>> u, state = opt.update(grad, state, w, value=value, grad=grad, value_fn=f)
    >>> print(f"{f(w + u):.2f}")
    5.04
    """
    owner = "scale_by_backtracking_linesearch"
    check_range("max_backtracking_steps", max_backtracking_steps, 0, owner=owner)
    check_range("decrease_factor", decrease_factor, 0.0, 1.0, high_inclusive=True, owner=owner)
    for name, v in dict(slope_rtol=slope_rtol, increase_factor=increase_factor,
                        max_learning_rate=max_learning_rate, atol=atol, rtol=rtol).items():
        check_range(name, v, 0.0, owner=owner)

    def init_fn(params: Params) -> ScaleByBacktrackingLinesearchState:
        dtype, one, inf = _init_common(params)
        return ScaleByBacktrackingLinesearchState(
            learning_rate=one, value=inf,
            grad=ft.zeros_like(params) if store_grad else None,
            info=BacktrackingLinesearchInfo(jnp.zeros([], jnp.int32), inf))

    def update_fn(updates: Updates, state: OptState, params: Optional[Params] = None, *,
                  value: Any = None, grad: Any = None, value_fn: Optional[Callable] = None,
                  **extra_args: Any) -> tuple[Updates, ScaleByBacktrackingLinesearchState]:
        check_state_type(state, ScaleByBacktrackingLinesearchState, owner)
        _, us, ws, gs, treedef = _checked_inputs(owner, updates, params, value, grad, value_fn)
        objective = functools.partial(value_fn, **_fn_kwargs(owner, value_fn, extra_args))
        dtype = _scalar_dtype(ws)  # as init's, whatever the state holds
        value = jnp.asarray(value).astype(dtype)
        # The slope of eta -> f(w + eta u) at 0 (optax's Re<u, conj(grad)>).
        slope = _re_vdot(us, [jnp.conj(g) for g in gs]).astype(dtype)

        def decrease_error(eta: Array, new_value: Array) -> Array:
            err = new_value - (1.0 + rtol) * value - eta * slope_rtol * slope
            return jnp.maximum(jnp.where(jnp.isnan(err), jnp.inf, err), 0.0).astype(dtype)

        def at(eta: Array) -> Any:
            return treedef.unflatten(_moved(ws, eta, us))

        def keep_going(carry: tuple) -> Array:
            _, _, _, err, k = carry
            return ~(err <= atol) & (k <= max_backtracking_steps)

        def trial(carry: tuple) -> tuple:
            eta, _, new_grad, _, k = carry
            eta = jnp.where(k > 0, decrease_factor * eta, eta).astype(dtype)
            point = at(eta)
            if not store_grad:
                new_value = jnp.asarray(objective(point)).astype(dtype)
                return eta, new_value, new_grad, decrease_error(eta, new_value), k + 1
            # The value and the linearization at once; the gradient (its transpose)
            # only at the trial that ends the search.
            raw, linear = jax.linearize(objective, point)
            new_value = jnp.asarray(raw).astype(dtype)
            err = decrease_error(eta, new_value)

            def gradient() -> list:
                (g,) = jax.linear_transpose(linear, point)(jnp.ones_like(raw))
                return [x.astype(w.dtype) for x, w in zip(treedef.flatten_up_to(g), ws)]

            new_grad = jax.lax.cond((err <= atol) | (k == max_backtracking_steps),
                                    gradient, lambda: new_grad)
            return eta, new_value, new_grad, err, k + 1

        start = jnp.minimum(increase_factor * state.learning_rate, max_learning_rate).astype(dtype)
        eta, new_value, new_grad, err, steps = jax.lax.while_loop(
            keep_going, trial, (start, value, [jnp.zeros_like(w) for w in ws],
                                jnp.asarray(jnp.inf, dtype), jnp.zeros([], jnp.int32)))
        if verbose:
            _report(err > atol, f"{owner}: no step size met sufficient decrease; decrease "
                    "error {err}, step size {eta} (0 if the objective was not finite there).",
                    err=err, eta=eta)
        eta = jnp.where(jnp.isinf(err), jnp.zeros_like(eta), eta)
        new_state = ScaleByBacktrackingLinesearchState(
            learning_rate=eta, value=new_value,
            grad=treedef.unflatten(new_grad) if store_grad else None,
            info=BacktrackingLinesearchInfo(steps, err))
        return treedef.unflatten(_scaled(eta, us)), new_state

    return GradientTransformationExtraArgs(init_fn, update_fn)


def _report(condition: Array, message: str, **values: Any) -> None:
    jax.lax.cond(condition, lambda: jax.debug.print(message, ordered=True, **values),
                 lambda: None)


# What scale_by_zoom_linesearch(verbose=True) prints when it fails (no braces: each is
# printed verbatim, the numbers follow it).
FLAG_INTERVAL_NOT_FOUND = (
    "No step size up to max_learning_rate brackets one that meets the curvature "
    "condition; raise max_learning_rate, the largest step size the search may try.")
FLAG_CURVATURE_COND_NOT_SATISFIED = (
    "The step size taken meets sufficient decrease but not the curvature condition.")
FLAG_INTERVAL_TOO_SMALL = (
    "The bracket around an acceptable step size shrank below stepsize_precision.")
FLAG_NO_STEPSIZE_FOUND = "No step size met even the sufficient-decrease condition."
FLAG_NOT_A_DESCENT_DIRECTION = (
    "The direction does not descend: the objective's slope along it at step size 0 "
    "must be negative.")


def _zoom_diagnostics(owner: str, out: Any, f0: Array, slope0: Array, tol: Any,
                      precision: Any) -> None:
    """Print why the zoom search ``out`` ended without meeting both conditions, if it did."""
    facts = ("step size taken {eta}; the last trial's decrease error {d}, curvature "
             "error {c}; at step size 0 the objective is {f0} and its slope {s0}.")
    values = dict(eta=out.stepsize, d=out.decrease_error, c=out.curvature_error, f0=f0,
                  s0=slope0)
    unmet = jnp.maximum(out.decrease_error, out.curvature_error) > tol
    # Phase 1 stops at max_learning_rate when nothing up to it brackets a point.
    _report(out.done & unmet, f"{owner}: {FLAG_INTERVAL_NOT_FOUND} "
            f"{FLAG_CURVATURE_COND_NOT_SATISFIED} After {{n}} trials: {facts}",
            n=out.count, **values)
    _report(out.failed, f"{owner}: no step size met both conditions in {{n}} trials; "
            f"{facts}", n=out.count, **values)
    length = jnp.abs(out.high - out.low)
    _report(out.failed & out.interval_found & (length <= precision),
            f"{owner}: {FLAG_INTERVAL_TOO_SMALL} Its length: {{length}}.", length=length)
    _report(out.failed & (out.safe_stepsize > 0.0),
            f"{owner}: {FLAG_CURVATURE_COND_NOT_SATISFIED} "
            "It is the best such step size found: {eta}.", eta=out.stepsize)
    none = out.failed & ~(out.safe_stepsize > 0.0)
    descent = slope0 < 0.0
    _report(none, f"{owner}: {FLAG_NO_STEPSIZE_FOUND}")
    _report(none & ~descent, f"{owner}: {FLAG_NOT_A_DESCENT_DIRECTION} It is {{s0}}.",
            s0=slope0)
    _report(none & descent, f"{owner}: raise max_linesearch_steps to let the search go on.")
    eps = jnp.finfo(jnp.float32).eps
    _report(none & descent & (out.stepsize < eps),
            f"{owner}: the step size {{eta}} is below float32's epsilon {eps}: compute in "
            "float64 (jax.config.update('jax_enable_x64', True)).", eta=out.stepsize)
    _report(none & descent & (jnp.abs(slope0) > 1e16),
            f"{owner}: the slope at step size 0 is huge ({{s0}}): the objective is badly "
            "conditioned; rescale the parameters or start from a better point.", s0=slope0)


class _Search(NamedTuple):
    """The zoom search's loop carry: the last trial, the bracket, the safe fallback."""

    count: Array
    stepsize: Array          # the last trial point, its value, gradient and slope
    value: Array
    grad: list
    slope: Array
    decrease_error: Array
    curvature_error: Array
    interval_found: Array    # phase 2 (zoom) once a bracket is known
    done: Array
    failed: Array
    low: Array               # the bracket: value(low) <= value(high), not low < high
    value_low: Array
    slope_low: Array
    high: Array
    value_high: Array
    slope_high: Array
    cubic_ref: Array         # the third point of the cubic interpolation
    value_cubic_ref: Array
    safe_stepsize: Array     # the best point with sufficient decrease so far (0: none)
    safe_value: Array
    safe_grad: list


def _cubic_minimizer(a: Array, fa: Array, fpa: Array, b: Array, fb: Array, c: Array,
                     fc: Array) -> Array:
    """The cubic's critical point through (a, fa), (b, fb), (c, fc), slope fpa at a (or NaN)."""
    db, dc = b - a, c - a
    denom = (db * dc) ** 2 * (db - dc)
    system = jnp.array([[dc ** 2, -(db ** 2)], [-(dc ** 3), db ** 3]])
    rhs = jnp.array([fb - fa - fpa * db, fc - fa - fpa * dc])
    cube, square = jnp.dot(system, rhs, precision=jax.lax.Precision.HIGHEST) / denom
    return a + (-square + jnp.sqrt(square * square - 3.0 * cube * fpa)) / (3.0 * cube)


def _quadratic_minimizer(a: Array, fa: Array, fpa: Array, b: Array, fb: Array) -> Array:
    """The critical point of the quadratic through (a, fa), (b, fb) with slope fpa at a."""
    db = b - a
    curvature = (fb - fa - fpa * db) / (db ** 2)
    return a - fpa / (2.0 * curvature)


def _zoom_trial_point(s: _Search, precision: Any) -> tuple:
    """Phase 2's next trial: cubic, else quadratic, else bisection (safeguarded)."""
    delta = jnp.abs(s.high - s.low)
    left, right = jnp.minimum(s.high, s.low), jnp.maximum(s.high, s.low)
    cubic = _cubic_minimizer(s.low, s.value_low, s.slope_low, s.high, s.value_high,
                             s.cubic_ref, s.value_cubic_ref)
    use_cubic = (cubic > left + 0.2 * delta) & (cubic < right - 0.2 * delta)
    quad = _quadratic_minimizer(s.low, s.value_low, s.slope_low, s.high, s.value_high)
    use_quad = ~use_cubic & (quad > left + 0.1 * delta) & (quad < right - 0.1 * delta)
    middle = jnp.where(use_cubic, cubic, jnp.where(use_quad, quad, (s.low + s.high) / 2.0))
    return middle, delta <= precision


def _pick(condition: Array, if_true: tuple, if_false: tuple) -> tuple:
    return tuple(jnp.where(condition, a, b) for a, b in zip(if_true, if_false))


@hyperparameters(max_linesearch_steps="number", max_learning_rate="bound or None",
                 tol="number", increase_factor="bound", slope_rtol="number", curv_rtol="bound",
                 approx_dec_rtol="number or None", stepsize_precision="number")
def scale_by_zoom_linesearch(
        max_linesearch_steps: int, max_learning_rate: Optional[float] = None,
        tol: float = 0.0, increase_factor: float = 2.0, slope_rtol: float = 1e-4,
        curv_rtol: float = 0.9, approx_dec_rtol: Optional[float] = 1e-6,
        stepsize_precision: float = 1e-5, initial_guess_strategy: str = "keep",
        verbose: bool = False) -> GradientTransformationExtraArgs:
    r"""Scale the direction by a step size meeting the strong Wolfe conditions (zoom search).

    Algorithms 3.5 and 3.6 of Nocedal and Wright (*Numerical Optimization*,
    1999), with Hager and Zhang's approximate decrease condition (CG_DESCENT,
    2006). With ``f`` the objective, ``w`` the params, ``u`` the direction and
    ``slope(eta) = Re<grad f(w + eta u), u>``, a step size ``eta`` is accepted
    when both errors are ``<= tol``::

        decrease:  f(w + eta u) - f(w) - slope_rtol * eta * slope(0)
                   (or, once f(w + eta u) <= f(w) + approx_dec_rtol |f(w)|, the smaller
                   slope(eta) - (2 slope_rtol - 1) slope(0))
        curvature: |slope(eta)| - curv_rtol |slope(0)|

    Phase 1 grows the step (``increase_factor`` times, from 1 or the last step
    size) until it brackets such a point; phase 2 shrinks the bracket (cubic or
    quadratic interpolation, or bisection). After ``max_linesearch_steps`` trials
    (or a bracket below ``stepsize_precision``) it returns the best point with
    sufficient decrease, if any, else the last trial. The update is ``eta * u``.
    ``curv_rtol=math.inf`` drops the curvature condition. Complex params work.

    Args:
      max_linesearch_steps: the most trial step sizes per step.
      max_learning_rate: the largest step size tried (``None``: no bound).
      tol: the tolerance on both errors.
      increase_factor: how much phase 1 grows the step size each trial.
      slope_rtol: the fraction of the predicted decrease to require.
      curv_rtol: the fraction of the initial slope the final slope may keep.
      approx_dec_rtol: the relative tolerance on ``f(w)`` that switches to the
        approximate decrease condition (``None``: Armijo's condition only).
      stepsize_precision: a bracket shorter than this ends the search with the
        best point of sufficient decrease, if one was found.
      initial_guess_strategy: ``'one'`` (start each search at 1) or ``'keep'``
        (at the last accepted step size).
      verbose: print (``jax.debug.print``) why the search failed, when it does:
        no bracket up to ``max_learning_rate`` (raise it), a bracket shrunk below
        ``stepsize_precision``, only sufficient decrease met, or not even that (and
        whether ``u`` is a descent direction), with the step size and both errors.

    Returns:
      A ``GradientTransformationExtraArgs`` whose state is
      :class:`ScaleByZoomLinesearchState`; ``update`` needs ``params`` and the
      keywords ``value``, ``grad`` and ``value_fn``; its other keywords are
      passed to ``value_fn``.

    >>> import jax, jax.numpy as jnp, functrain
    >>> f = lambda w: jnp.sum(w ** 2)
    >>> opt = functrain.chain(functrain.sgd(1.0), scale_by_zoom_linesearch(15))
    >>> w = jnp.array([1., 2., 3.])
    >>> state = opt.init(w)
    >>> value, grad = jax.value_and_grad(f)(w)
    >>> u, state = opt.update(grad, state, w, value=value, grad=grad, value_fn=f)
    >>> print(w + u, state[-1].learning_rate)
    [0. 0. 0.] 0.5
    """
    owner = "scale_by_zoom_linesearch"
    check_range("max_linesearch_steps", max_linesearch_steps, 0, owner=owner)
    for name, v in dict(max_learning_rate=max_learning_rate, tol=tol,
                        increase_factor=increase_factor, slope_rtol=slope_rtol,
                        curv_rtol=curv_rtol, approx_dec_rtol=approx_dec_rtol,
                        stepsize_precision=stepsize_precision).items():
        if v is not None:
            check_range(name, v, 0.0, owner=owner)
    if initial_guess_strategy not in ("one", "keep"):
        raise ValueError(f"{owner}: initial_guess_strategy must be 'one' or 'keep', got "
                         f"{initial_guess_strategy!r}.")

    def init_fn(params: Params) -> ScaleByZoomLinesearchState:
        dtype, one, inf = _init_common(params)
        return ScaleByZoomLinesearchState(
            learning_rate=one, value=inf, grad=ft.zeros_like(params),
            info=ZoomLinesearchInfo(jnp.zeros([], jnp.int32), inf, inf))

    def update_fn(updates: Updates, state: OptState, params: Optional[Params] = None, *,
                  value: Any = None, grad: Any = None, value_fn: Optional[Callable] = None,
                  **extra_args: Any) -> tuple[Updates, ScaleByZoomLinesearchState]:
        check_state_type(state, ScaleByZoomLinesearchState, owner)
        paths, us, ws, gs, treedef = _checked_inputs(owner, updates, params, value, grad,
                                                     value_fn)
        olds = ft.flatten_like(treedef, state.grad, f"{owner} state .grad", updates, "updates")
        ft.check_shapes(paths, olds, us, "updates", f"{owner} state .grad")
        value_and_grad = jax.value_and_grad(
            functools.partial(value_fn, **_fn_kwargs(owner, value_fn, extra_args)))
        dtype = _scalar_dtype(ws)  # as init's, whatever the state holds
        f0 = jnp.asarray(value).astype(dtype)
        g0 = [g.astype(w.dtype) for g, w in zip(gs, ws)]
        slope0 = _re_vdot(us, g0).astype(dtype)

        def probe(eta: Array) -> tuple:
            f, g = value_and_grad(treedef.unflatten(_moved(ws, eta, us)))
            g = [x.astype(w.dtype) for x, w in zip(treedef.flatten_up_to(g), ws)]
            slope = _re_vdot([jnp.conj(x) for x in g], us).astype(dtype)
            return jnp.asarray(f).astype(dtype), g, slope

        def errors(eta: Array, f: Array, slope: Array) -> tuple:
            dec = f - f0 - slope_rtol * eta * slope0
            if approx_dec_rtol is not None:
                approx = jnp.maximum(slope - (2 * slope_rtol - 1.0) * slope0,
                                     f - f0 - approx_dec_rtol * jnp.abs(f0))
                dec = jnp.minimum(approx, dec)
            dec = jnp.maximum(dec, 0.0)
            curv = jnp.maximum(jnp.abs(slope) - curv_rtol * jnp.abs(slope0), 0.0)
            return tuple(jnp.where(jnp.isnan(e), jnp.inf, e).astype(dtype)
                         for e in (dec, curv))

        def phase(s: _Search, zooming: bool) -> _Search:
            """One trial of phase 1 (Algorithm 3.5) or phase 2 (Algorithm 3.6)."""
            k, too_small = s.count, jnp.asarray(False)
            if zooming:
                eta, too_small = _zoom_trial_point(s, stepsize_precision)
                eta, at_cap = eta.astype(dtype), jnp.asarray(False)
            else:
                eta = jnp.where(k == 0, guess, increase_factor * s.stepsize).astype(dtype)
                at_cap = jnp.asarray(False)
                if max_learning_rate is not None:
                    at_cap = eta >= max_learning_rate
                    eta = jnp.minimum(eta, max_learning_rate).astype(dtype)
            f, g, slope = probe(eta)
            dec, curv = errors(eta, f, slope)
            met = jnp.maximum(dec, curv) <= tol
            last = k + 1 >= max_linesearch_steps
            new, prev = (eta, f, slope), (s.stepsize, s.value, s.slope)
            low, high = (s.low, s.value_low, s.slope_low), (s.high, s.value_high, s.slope_high)
            if zooming:  # shrink the bracket around the trial
                hi_mid = (dec > 0.0) | (f >= s.value_low)
                hi_low = (slope * (s.high - s.low) >= 0.0) & ~hi_mid
                cubic = _pick(hi_mid | hi_low, high[:2], low[:2])
                high = _pick(hi_low, low, _pick(hi_mid, new, high))
                low = _pick(~hi_mid, new, low)
                safe_now = (dec <= tol) & (f < s.safe_value)
                done, found = met, jnp.asarray(True)
            else:  # does the trial bracket an acceptable point?
                hi_new = (dec > 0.0) | ((f >= s.value) & (k > 0))
                lo_new = (slope >= 0.0) & ~hi_new
                found = hi_new | lo_new | met
                done = met | (at_cap & ~found)
                low, high = _pick(lo_new, new, prev), _pick(lo_new, prev, new)
                cubic, safe_now = low[:2], dec <= tol
            safe = (jnp.where(safe_now, eta, s.safe_stepsize),
                    jnp.where(safe_now, f, s.safe_value))
            safe_grad = [jnp.where(safe_now, a, b) for a, b in zip(g, s.safe_grad)]
            failed = (last | (too_small & (safe[0] > 0.0))) & ~done
            return _Search(safe_increment(k), eta, f, g, slope, dec, curv, found, done, failed,
                           *low, *high, *cubic, *safe, safe_grad)

        def step(s: _Search) -> _Search:
            s = jax.lax.cond(s.interval_found, lambda c: phase(c, True),
                             lambda c: phase(c, False), s)
            # On failure: the best point with sufficient decrease if any (or if the
            # trial's objective is not finite), else the trial itself.
            fallback = s.failed & ((s.safe_stepsize > 0.0) | jnp.isinf(s.decrease_error))
            final = _pick(fallback, (s.safe_stepsize, s.safe_value), (s.stepsize, s.value))
            grad = [jnp.where(fallback, a, b) for a, b in zip(s.safe_grad, s.grad)]
            return s._replace(stepsize=final[0], value=final[1], grad=grad)

        guess = jnp.asarray(1.0 if initial_guess_strategy == "one" else state.learning_rate,
                            dtype)
        zero, inf, no = jnp.zeros([], dtype), jnp.asarray(jnp.inf, dtype), jnp.asarray(False)
        start = _Search(jnp.zeros([], jnp.int32), zero, f0, g0, slope0, inf, inf, no, no, no,
                        zero, f0, slope0, zero, f0, slope0, zero, f0, zero, f0, g0)
        out = jax.lax.while_loop(lambda s: ~(s.done | s.failed), step, start)
        if verbose:
            _zoom_diagnostics(owner, out, f0, slope0, tol, stepsize_precision)
        new_state = ScaleByZoomLinesearchState(
            learning_rate=out.stepsize, value=out.value,
            grad=treedef.unflatten([x.astype(o.dtype) for x, o in zip(out.grad, olds)]),
            info=ZoomLinesearchInfo(out.count, out.decrease_error, out.curvature_error))
        return treedef.unflatten(_scaled(out.stepsize, us)), new_state

    return GradientTransformationExtraArgs(init_fn, update_fn)


__all__ = ["BacktrackingLinesearchInfo", "ScaleByBacktrackingLinesearchState",
           "ScaleByZoomLinesearchState", "ZoomLinesearchInfo",
           "scale_by_backtracking_linesearch", "scale_by_zoom_linesearch"]
