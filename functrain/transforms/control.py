"""Wrappers that decide when, and with which hyperparameters, an optimizer steps.

``MultiSteps`` (gradient accumulation), ``apply_if_finite`` (skip bad steps)
and ``inject_hyperparams`` (hyperparameters in the state). They act on whole
optimizers, not on leaves, so they are plain transformations around the
wrapped one; the stages inside it still run fused. Branches use ``lax.cond``
with both sides' outputs made identical in shape and dtype (the source of
optax's bfloat16 ``MultiSteps`` bug), so they work under ``jit``, ``scan`` and
sharded jit.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from functrain import tree as ft
from functrain.transforms.base import (GradientTransformation, _call_update, check_range,
                                       safe_increment)
from functrain.transforms.wrappers import _check_state, _check_tx, _sorted

Array = jax.Array
PyTree = Any
Params = Any
Updates = Any


# --------------------------------------------------------------------------
# MultiSteps: gradient accumulation
# --------------------------------------------------------------------------

class MultiStepsState(NamedTuple):
    """State of :class:`MultiSteps`.

    ``mini_step`` counts micro-batches since the last real update,
    ``gradient_step`` counts real updates, ``acc_grads`` holds the running
    mean (or sum) of the micro-batch gradients, ``skip_state`` what
    ``should_skip_update_fn`` returned last.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.MultiSteps(functrain.sgd(0.1), every_k_schedule=2)
    >>> opt.init({'w': jnp.zeros(2)}).acc_grads
    {'w': Array([0., 0.], dtype=float32)}
    """

    mini_step: Array
    gradient_step: Array
    inner_opt_state: Any
    acc_grads: Any
    skip_state: Any = ()


def _never_skip(updates: Updates, gradient_step: Array, params: Optional[Params]
                ) -> tuple[Array, Any]:
    return jnp.array(False), ()


class MultiSteps:
    """Accumulate gradients over ``k`` micro-batches, then apply one real update.

    Between real updates the returned updates are zeros; on every ``k``-th call
    the wrapped optimizer sees the mean (``use_grad_mean``) or the sum of the
    ``k`` gradients. ``every_k_schedule`` is an int or a function of the
    number of real updates so far. ``should_skip_update_fn(updates,
    gradient_step, params) -> (bool, info)`` can reject a micro-batch as if it
    never happened. The accumulator is stored in ``accumulator_dtype``
    (float32 by default, as optax; pass ``jnp.float64`` to accumulate float64
    gradients in full precision, or ``None`` for the gradients' own dtype);
    the wrapped optimizer gets it cast back to the incoming gradients' dtype,
    so bfloat16 params with float32 gradients work (an optax bug). Works under
    ``jax.jit``, ``jax.lax.scan`` and sharded jit; the inner optimizer runs
    only on real-update steps (a ``lax.cond``).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.MultiSteps(functrain.sgd(1.0), every_k_schedule=2)
    >>> params = {'w': jnp.zeros(1)}
    >>> state = opt.init(params)
    >>> u, state = opt.update({'w': jnp.array([1.])}, state, params)
    >>> u, bool(opt.has_updated(state))
    ({'w': Array([0.], dtype=float32)}, False)
    >>> u, state = opt.update({'w': jnp.array([3.])}, state, params)
    >>> u, bool(opt.has_updated(state))
    ({'w': Array([-2.], dtype=float32)}, True)
    """

    def __init__(self, opt: GradientTransformation,
                 every_k_schedule: Union[int, Callable[[Array], Array]],
                 use_grad_mean: bool = True,
                 should_skip_update_fn: Optional[Callable[..., tuple[Array, Any]]] = None,
                 accumulator_dtype: Any = jnp.float32) -> None:
        _check_tx(opt, "MultiSteps", "opt")
        if isinstance(every_k_schedule, (int, np.integer)) and not isinstance(
                every_k_schedule, bool):
            if every_k_schedule < 1:
                raise ValueError(f"MultiSteps: every_k_schedule must be >= 1, got "
                                 f"{every_k_schedule}.")
            k = int(every_k_schedule)
            self._every_k_schedule: Callable[[Array], Any] = lambda step: k
        elif callable(every_k_schedule):
            self._every_k_schedule = every_k_schedule
        else:
            raise TypeError(f"MultiSteps: every_k_schedule must be an int or a function of "
                            f"the step, got {type(every_k_schedule).__name__}.")
        self._opt = opt
        self._use_grad_mean = use_grad_mean
        self._should_skip = should_skip_update_fn or _never_skip
        self._accumulator_dtype = accumulator_dtype

    @property
    def inner_opt(self) -> GradientTransformation:
        """The wrapped optimizer.

        >>> import functrain
        >>> opt = functrain.sgd(0.1)
        >>> functrain.MultiSteps(opt, 2).inner_opt is opt
        True
        """
        return self._opt

    def _acc(self, x: Array) -> Any:
        if self._accumulator_dtype is None:
            return x.dtype
        return self._accumulator_dtype

    def init(self, params: Params) -> MultiStepsState:
        """The initial state: zero accumulator, counters at zero.

        >>> import jax.numpy as jnp, functrain
        >>> functrain.MultiSteps(functrain.sgd(0.1), 4).init([jnp.ones(1)]).mini_step
        Array(0, dtype=int32)
        """
        gradient_step = jnp.zeros([], jnp.int32)
        _, skip_state = self._should_skip(ft.zeros_like(params), gradient_step, params)
        return MultiStepsState(
            mini_step=jnp.zeros([], jnp.int32), gradient_step=gradient_step,
            inner_opt_state=self._opt.init(params),
            acc_grads=jax.tree_util.tree_map(
                lambda p: ft.zeros_like(p, self._acc(p)), params),
            skip_state=skip_state)

    def update(self, updates: Updates, state: MultiStepsState,
               params: Optional[Params] = None, **extra_args: Any
               ) -> tuple[Updates, MultiStepsState]:
        """Accumulate one micro-batch; every ``k``-th call, run the wrapped optimizer.

        >>> import jax.numpy as jnp, functrain
        >>> opt = functrain.MultiSteps(functrain.sgd(1.0), 1)
        >>> opt.update([jnp.array([2.])], opt.init([jnp.zeros(1)]))[0]
        [Array([-2.], dtype=float32)]
        """
        _check_state(state, MultiStepsState, "MultiSteps")
        ft.check_structure(updates, state.acc_grads, "MultiSteps state .acc_grads", "updates")
        if params is not None:
            ft.check_structure(updates, params, "params", "updates")
        k = self._every_k_schedule(state.gradient_step)
        skip, skip_state = self._should_skip(updates, state.gradient_step, params)
        skip = jnp.asarray(skip)
        if skip.dtype != jnp.bool_ or skip.shape != ():
            raise ValueError(f"MultiSteps: should_skip_update_fn must return a scalar bool "
                             f"array first, got dtype {skip.dtype} and shape {skip.shape}.")
        n = state.mini_step

        def accumulate(g: Array, acc: Array) -> Array:
            g = g.astype(jnp.promote_types(g.dtype, acc.dtype))
            new = acc + (g - acc) / (n + 1).astype(g.dtype) if self._use_grad_mean else acc + g
            return new.astype(acc.dtype)

        acc = jax.tree_util.tree_map(accumulate, updates, state.acc_grads)
        emit = jnp.logical_and(n == k - 1, jnp.logical_not(skip))
        inner_in = jax.tree_util.tree_map(lambda a, g: a.astype(g.dtype), acc, updates)

        def real_step() -> tuple[Updates, Any]:
            return _call_update(self._opt, inner_in, state.inner_opt_state, params, extra_args)

        shapes = jax.eval_shape(real_step)

        def no_step() -> tuple[Updates, Any]:
            zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes[0])
            return zeros, jax.tree_util.tree_map(lambda x, s: jnp.asarray(x).astype(s.dtype),
                                                 state.inner_opt_state, shapes[1])

        def real_step_cast() -> tuple[Updates, Any]:
            new_updates, new_inner = real_step()
            return new_updates, jax.tree_util.tree_map(
                lambda x, s: jnp.asarray(x).astype(s.dtype), new_inner, shapes[1])

        new_updates, inner_state = jax.lax.cond(emit, real_step_cast, no_step)
        keep = lambda new, old: jnp.where(skip, old, new)  # noqa: E731
        acc = jax.tree_util.tree_map(
            lambda a, old: keep(jnp.where(emit, jnp.zeros_like(a), a), old), acc, state.acc_grads)
        return new_updates, MultiStepsState(
            mini_step=keep(safe_increment(n) % jnp.asarray(k, n.dtype), n),
            gradient_step=jnp.where(emit, safe_increment(state.gradient_step),
                                    state.gradient_step),
            inner_opt_state=inner_state, acc_grads=acc, skip_state=skip_state)

    def has_updated(self, state: MultiStepsState) -> Array:
        """True right after a step that applied a real update.

        >>> import jax.numpy as jnp, functrain
        >>> opt = functrain.MultiSteps(functrain.sgd(0.1), 2)
        >>> bool(opt.has_updated(opt.init([jnp.ones(1)])))
        False
        """
        return jnp.logical_and(state.mini_step == 0, state.gradient_step > 0)

    def gradient_transformation(self) -> GradientTransformation:
        """This wrapper as a plain ``GradientTransformation`` (for ``chain`` etc.).

        >>> import functrain
        >>> tx = functrain.MultiSteps(functrain.sgd(0.1), 2).gradient_transformation()
        >>> isinstance(tx, functrain.GradientTransformation)
        True
        """
        return GradientTransformation(self.init, self.update)


# --------------------------------------------------------------------------
# apply_if_finite
# --------------------------------------------------------------------------

class ApplyIfFiniteState(NamedTuple):
    """State of :func:`apply_if_finite`.

    ``notfinite_count``: consecutive non-finite steps so far (reset to 0 by a
    finite step and by a forced update); ``last_finite``: whether the last
    step was finite; ``total_notfinite``: all non-finite steps seen.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.apply_if_finite(functrain.sgd(0.1), 2)
    >>> tx.init([jnp.ones(1)]).total_notfinite
    Array(0, dtype=int32)
    """

    notfinite_count: Array
    last_finite: Array
    total_notfinite: Array
    inner_state: Any


def apply_if_finite(inner: GradientTransformation,
                    max_consecutive_errors: int) -> GradientTransformation:
    """Skip steps whose updates hold NaN or Inf; give up after too many in a row.

    A non-finite step returns zero updates and leaves ``inner`` 's state
    untouched. After ``max_consecutive_errors`` skipped steps in a row, the
    next non-finite step is applied anyway (as optax); unlike optax, the
    consecutive counter then restarts from zero, so the following bad steps
    are skipped again.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.apply_if_finite(functrain.sgd(1.0), max_consecutive_errors=2)
    >>> state = tx.init([jnp.zeros(1)])
    >>> u, state = tx.update([jnp.array([jnp.nan])], state)
    >>> u, int(state.notfinite_count)
    ([Array([0.], dtype=float32)], 1)
    """
    _check_tx(inner, "apply_if_finite")
    check_range("max_consecutive_errors", max_consecutive_errors, 0.0,
                owner="apply_if_finite")

    def init_fn(params: Params) -> ApplyIfFiniteState:
        return ApplyIfFiniteState(jnp.zeros([], jnp.int32), jnp.array(True),
                                  jnp.zeros([], jnp.int32), inner.init(params))

    def update_fn(updates: Updates, state: ApplyIfFiniteState,
                  params: Optional[Params] = None, **extra_args: Any
                  ) -> tuple[Updates, ApplyIfFiniteState]:
        _check_state(state, ApplyIfFiniteState, "apply_if_finite")
        finite = jnp.array(True)
        for x in jax.tree_util.tree_leaves(updates):
            finite = jnp.logical_and(finite, jnp.all(jnp.isfinite(x)))
        count = jnp.where(finite, 0, safe_increment(state.notfinite_count))
        forced = count > max_consecutive_errors
        apply = jnp.logical_or(finite, forced)

        def step() -> tuple[Updates, Any]:
            return _call_update(inner, updates, state.inner_state, params, extra_args)

        shapes = jax.eval_shape(step)

        def do() -> tuple[Updates, Any]:
            new_updates, new_inner = step()
            return new_updates, jax.tree_util.tree_map(
                lambda x, s: jnp.asarray(x).astype(s.dtype), new_inner, shapes[1])

        def skip() -> tuple[Updates, Any]:
            return (jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes[0]),
                    jax.tree_util.tree_map(lambda x, s: jnp.asarray(x).astype(s.dtype),
                                           state.inner_state, shapes[1]))

        new_updates, inner_state = jax.lax.cond(apply, do, skip)
        return new_updates, ApplyIfFiniteState(
            notfinite_count=jnp.where(forced, 0, count).astype(jnp.int32),
            last_finite=finite,
            total_notfinite=jnp.where(finite, state.total_notfinite,
                                      safe_increment(state.total_notfinite)),
            inner_state=inner_state)

    return GradientTransformation(init_fn, update_fn)


# --------------------------------------------------------------------------
# inject_hyperparams
# --------------------------------------------------------------------------

class HyperparamsDict(dict):
    """The ``hyperparams`` of :class:`InjectHyperparamsState`: a dict that stores arrays.

    A number assigned to it (a Python float, a NumPy scalar, an array) is
    stored as an array of the same dtype and weak type as the value it
    replaces, so a jitted step sees the same input types whatever is assigned
    and never recompiles (a plain dict holding a Python float would add a
    second entry to ``jit`` 's dispatch cache). It is a pytree like a dict.

    >>> import jax.numpy as jnp
    >>> h = HyperparamsDict(learning_rate=jnp.asarray(0.1))
    >>> h['learning_rate'] = 0.01
    >>> h
    {'learning_rate': Array(0.01, dtype=float32, weak_type=True)}
    """

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, _like(value, self.get(key)))

    def update(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Assign several values (each converted as by ``d[key] = value``)."""
        for key, value in dict(*args, **kwargs).items():
            self[key] = value


def _like(value: Any, old: Any) -> Any:
    if isinstance(value, jax.core.Tracer) or not hasattr(old, "dtype"):
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(
            value, (int, float, np.number, np.ndarray, jax.Array)):
        return value
    if getattr(old, "weak_type", False) and np.ndim(value) == 0:
        python = float(value) if jnp.issubdtype(old.dtype, jnp.floating) else int(value)
        weak = jnp.asarray(python)
        if weak.dtype == old.dtype:
            return weak
    return jnp.asarray(value, old.dtype)


jax.tree_util.register_pytree_with_keys(
    HyperparamsDict,
    lambda d: ([(jax.tree_util.DictKey(k), d[k]) for k in sorted(d)], tuple(sorted(d))),
    lambda keys, values: HyperparamsDict(zip(keys, values)),
    flatten_func=lambda d: ([d[k] for k in sorted(d)], tuple(sorted(d))))


class InjectHyperparamsState(NamedTuple):
    """State of :func:`inject_hyperparams`.

    ``hyperparams`` maps each numeric argument's name to its current value
    (an array, in a :class:`HyperparamsDict`); assign to it between steps
    (``state.hyperparams['learning_rate'] = 0.01``) to change it without
    recompiling. Schedules are re-evaluated at ``count`` every step.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.inject_hyperparams(functrain.sgd)(learning_rate=0.1)
    >>> opt.init([jnp.ones(1)]).hyperparams
    {'learning_rate': Array(0.1, dtype=float32, weak_type=True)}
    """

    count: Array
    hyperparams: HyperparamsDict
    inner_state: Any


def _is_static(name: str, value: Any, static: set, declared: Iterable[str]) -> bool:
    if name in static or name in declared:
        return True
    if value is None or isinstance(value, (bool, np.bool_, str, type, np.dtype)):
        return True
    # Masks and dtypes are never hyperparameters (optax would take a mask
    # function or ``jnp.bfloat16`` for a schedule).
    return "mask" in name or "dtype" in name


def _to_dtype(value: Any, dtype: Any) -> Any:
    """Floats as arrays of ``dtype``; Python floats stay weakly typed when possible."""
    if isinstance(value, jax.Array) and not getattr(value, "weak_type", False):
        return value
    if isinstance(value, jax.core.Tracer) and not jax.typeof(value).weak_type:
        return value
    current = getattr(value, "dtype", None)
    if current is None:
        current = np.asarray(value).dtype
    if not jnp.issubdtype(current, jnp.floating):
        return jnp.asarray(value)
    weak = jnp.asarray(value)
    if weak.dtype == jnp.dtype(dtype) and getattr(weak, "weak_type", False):
        return weak
    return jnp.asarray(value, dtype)


def inject_hyperparams(inner_factory: Callable[..., GradientTransformation],
                       static_args: Union[str, Iterable[str]] = (),
                       hyperparam_dtype: Optional[Any] = None
                       ) -> Callable[..., GradientTransformation]:
    """Make an optimizer's numeric arguments part of its state.

    ``inject_hyperparams(factory)(*args, **kwargs)`` behaves like
    ``factory(*args, **kwargs)``, but every numeric argument lives in
    ``state.hyperparams`` (a dict) and may be changed between steps without
    recompiling a jitted step; arguments given as functions (schedules) are
    evaluated at the step count, and their current value is shown in
    ``hyperparams``. ``static_args`` names arguments to keep as Python values;
    booleans, strings, ``None``, masks and dtypes are always static, as are
    the names a factory lists in its ``static_hyperparams`` attribute (e.g.
    adafactor's ``min_dim_size_to_factor``). Floats are stored in
    ``hyperparam_dtype``, by default the widest floating dtype of the params
    and at least float32 (optax uses the params' dtype, so bfloat16 params
    would round the learning rate).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.inject_hyperparams(functrain.sgd)(learning_rate=0.1)
    >>> params = [jnp.ones(1)]
    >>> state = opt.init(params)
    >>> state.hyperparams['learning_rate'] = 0.01
    >>> opt.update([jnp.ones(1)], state)[0]
    [Array([-0.01], dtype=float32)]
    """
    static = {static_args} if isinstance(static_args, str) else set(static_args)
    signature = inspect.signature(inner_factory)
    if not static.issubset(signature.parameters):
        raise ValueError(f"inject_hyperparams: static_args {_sorted(static)} must name "
                         f"parameters of {getattr(inner_factory, '__name__', 'the factory')}, "
                         f"whose parameters are {list(signature.parameters)}.")
    declared = tuple(getattr(inner_factory, "static_hyperparams", ()))

    def wrapped(*args: Any, **kwargs: Any) -> GradientTransformation:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            kind = signature.parameters[name].kind
            if kind is inspect.Parameter.VAR_KEYWORD:
                arguments.update(value)
            elif kind is inspect.Parameter.VAR_POSITIONAL:
                if value:
                    raise TypeError("inject_hyperparams: factories taking *args are not "
                                    "supported; pass those arguments by name.")
            else:
                arguments[name] = value
        other, numeric, schedules = {}, {}, {}
        for name, value in arguments.items():
            if _is_static(name, value, static, declared):
                other[name] = value
            elif callable(value):
                schedules[name] = value
            elif isinstance(value, (int, float, np.number, np.ndarray, jax.Array)):
                numeric[name] = value
            else:
                other[name] = value

        def dtype_of(tree: PyTree) -> Any:
            if hyperparam_dtype is not None:
                return hyperparam_dtype
            dtype = jnp.dtype(jnp.float32)
            for x in jax.tree_util.tree_leaves(tree):
                d = getattr(x, "dtype", None)
                if d is not None and jnp.issubdtype(d, jnp.floating):
                    dtype = jnp.promote_types(dtype, ft.compute_dtype(d))
            return dtype

        def current(values: dict, count: Array, dtype: Any) -> dict:
            out = {k: _to_dtype(v, dtype) for k, v in values.items()}
            out.update({k: _to_dtype(f(count), dtype) for k, f in schedules.items()})
            return out

        def init_fn(params: Params) -> InjectHyperparamsState:
            count = jnp.zeros([], jnp.int32)
            hparams = current(numeric, count, dtype_of(params))
            return InjectHyperparamsState(count, HyperparamsDict(hparams),
                                          inner_factory(**other, **hparams).init(params))

        def update_fn(updates: Updates, state: InjectHyperparamsState,
                      params: Optional[Params] = None, **extra_args: Any
                      ) -> tuple[Updates, InjectHyperparamsState]:
            _check_state(state, InjectHyperparamsState, "inject_hyperparams")
            unknown = set(state.hyperparams) - set(numeric) - set(schedules)
            if unknown:
                raise ValueError(f"inject_hyperparams: state.hyperparams has unknown keys "
                                 f"{_sorted(unknown)}; the injected hyperparameters are "
                                 f"{_sorted(set(numeric) | set(schedules))}.")
            values = {k: state.hyperparams.get(k, v) for k, v in numeric.items()}
            hparams = current(values, state.count,
                              dtype_of(params if params is not None else updates))
            new_updates, inner_state = _call_update(
                inner_factory(**other, **hparams), updates, state.inner_state, params,
                extra_args)
            return new_updates, InjectHyperparamsState(safe_increment(state.count),
                                                       HyperparamsDict(hparams),
                                                       inner_state)

        return GradientTransformation(init_fn, update_fn)

    wrapped.__name__ = getattr(inner_factory, "__name__", "wrapped")
    wrapped.__doc__ = getattr(inner_factory, "__doc__", None)
    return wrapped
