"""Watching the updates inside a chain: ``snapshot``, ``monitor``, ``measure_with_ema``.

Each passes the updates through unchanged and keeps measurements of them in
its state, where a training loop can read them (``state[i].measurements``).
Names, arguments, state classes and numbers are optax 0.2.8's; unlike optax,
``monitor`` 's ``init`` already holds every measurement (zeros), so the state
has the same structure before and after a step (a ``lax.scan`` carry, one
``jit`` trace), and ``measure_with_ema`` averages bool and integer
measurements in a float dtype from the start.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain.arg_checks import check_range, check_state_type, state_mismatch_error
from functrain.declarations import hyperparameters
from functrain.numerics import bias_correction_factor, ema_update
from functrain.engine.protocol import (EmptyState, GradientTransformation, OptState, Params,
                                       Updates, call_update)
from functrain.engine.counts import safe_increment
from functrain.engine.program import chain

Array = jax.Array
PyTree = Any


class SnapshotState(NamedTuple):
    """State of :func:`snapshot`: the last measurement, under its name.

    Attributes:
      measurement: ``{measure_name: measure(updates)}`` of the last step
        (after ``init``: of the params).

    >>> import jax.numpy as jnp, functrain
    >>> functrain.snapshot('norm', functrain.tree.norm).init([jnp.array([3., 4.])])
    SnapshotState(measurement={'norm': Array(5., dtype=float32)})
    """

    measurement: dict


def snapshot(measure_name: str, measure: Callable[[Updates], PyTree]
             ) -> GradientTransformation:
    """Pass the updates through and keep ``measure(updates)`` in the state.

    Placed in a chain, it sees the updates as transformed up to there (e.g.
    their norm before clipping).

    Args:
      measure_name: the key the measurement is stored under.
      measure: a function of the updates tree returning a tree of arrays.

    Returns:
      A ``GradientTransformation`` whose state is :class:`SnapshotState`
      ``({measure_name: measure(updates)})``; after ``init``, the measure of
      the params.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.chain(functrain.snapshot('norm', functrain.tree.norm),
    ...                      functrain.clip_by_global_norm(1.0))
    >>> u, state = tx.update([jnp.array([3., 4.])], tx.init([jnp.zeros(2)]))
    >>> print(state[0].measurement['norm'], u[0])
    5.0 [0.6 0.8]
    """
    if not isinstance(measure_name, str):
        raise TypeError(f"snapshot: measure_name must be a str, got "
                        f"{type(measure_name).__name__}.")
    if not callable(measure):
        raise TypeError(f"snapshot: measure must be a function of the updates, got "
                        f"{type(measure).__name__}.")

    def init_fn(params: Params) -> SnapshotState:
        return SnapshotState({measure_name: measure(params)})

    def update_fn(updates: Updates, state: SnapshotState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, SnapshotState]:
        del params, extra_args
        check_state_type(state, SnapshotState, "snapshot")
        return updates, SnapshotState({measure_name: measure(updates)})

    return GradientTransformation(init_fn, update_fn)


class MonitorState(NamedTuple):
    """State of :func:`monitor`.

    Attributes:
      measurements: ``{name: measurement}`` of the last step (zeros shaped like
        the measurements after ``init``).
      measure_states: the states of the measures that are transformations, in
        the order of the names (``EmptyState()`` for plain functions).

    >>> import jax.numpy as jnp, functrain
    >>> functrain.monitor({'norm': functrain.tree.norm}).init([jnp.ones(1)])
    MonitorState(measurements={'norm': Array(0., dtype=float32)}, measure_states=(EmptyState(),))
    """

    measurements: dict
    measure_states: tuple


def _as_transformation(measure: Any) -> Any:
    """A measure as a transformation: functions of the updates keep no state."""
    if callable(getattr(measure, "init", None)) and callable(getattr(measure, "update", None)):
        return measure

    def update_fn(updates: Updates, state: OptState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[PyTree, EmptyState]:
        return measure(updates), EmptyState()

    return GradientTransformation(lambda params: EmptyState(), update_fn)


def monitor(measures: Mapping[str, Any]) -> GradientTransformation:
    """Pass the updates through and keep named (possibly stateful) measurements of them.

    Extends :func:`snapshot` to several measurements, each either a function
    of the updates or a transformation whose *output* is the measurement
    (e.g. :func:`measure_with_ema`, an average over steps, with its own state).
    Extra keyword arguments of ``update`` reach the measures that take them.

    Args:
      measures: ``{name: measure}``, each a function of the updates tree or a
        transformation (an object with ``init`` and ``update``).

    Returns:
      A ``GradientTransformation`` whose state is :class:`MonitorState`
      ``(measurements, measure_states)``.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.monitor({
    ...     'norm': functrain.tree.norm,
    ...     'norm_ema': functrain.measure_with_ema(functrain.tree.norm, decay=0.5)})
    >>> state = tx.init([jnp.zeros(2)])
    >>> u, state = tx.update([jnp.array([3., 4.])], state)
    >>> u, state = tx.update([jnp.array([0., 1.])], state)
    >>> {k: round(float(v), 4) for k, v in state.measurements.items()}
    {'norm': 1.0, 'norm_ema': 2.3333}
    """
    if not isinstance(measures, Mapping):
        raise TypeError(f"monitor: measures must be a dict of name -> measure, got "
                        f"{type(measures).__name__}.")
    for name, measure in measures.items():
        if not callable(measure) and not callable(getattr(measure, "update", None)):
            raise TypeError(f"monitor: measure {name!r} must be a function of the updates "
                            f"or a transformation, got {type(measure).__name__}.")
    names = tuple(measures)
    txs = tuple(_as_transformation(measures[n]) for n in names)

    def measure_all(updates: Updates, states: tuple, params: Optional[Params],
                    extra_args: dict) -> tuple[dict, tuple]:
        outs = [call_update(tx, updates, s, params, extra_args) for tx, s in zip(txs, states)]
        return {n: o[0] for n, o in zip(names, outs)}, tuple(o[1] for o in outs)

    def init_fn(params: Params) -> MonitorState:
        states = tuple(tx.init(params) for tx in txs)
        shapes = jax.eval_shape(lambda p, s: measure_all(p, s, None, {})[0], params, states)
        zeros = jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
        return MonitorState(zeros, states)

    def update_fn(updates: Updates, state: MonitorState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, MonitorState]:
        check_state_type(state, MonitorState, "monitor")
        if len(state.measure_states) != len(txs):
            raise state_mismatch_error("monitor", f"the state holds "
                                       f"{len(state.measure_states)} measure states for "
                                       f"{len(txs)} measures", "this monitor")
        measurements, states = measure_all(updates, state.measure_states, params, extra_args)
        return updates, MonitorState(measurements, states)

    return GradientTransformation(init_fn, update_fn)


class MeasureEmaState(NamedTuple):
    """State of the average in :func:`measure_with_ema` (optax's ``EmaState`` fields).

    Attributes:
      count: the number of measurements averaged (int32).
      ema: the moving average of the measurements (not debiased).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.measure_with_ema(functrain.tree.norm, decay=0.9)
    >>> tx.init([jnp.ones(1)])[1]
    MeasureEmaState(count=Array(0, dtype=int32), ema=Array(0., dtype=float32))
    """

    count: Array
    ema: PyTree


@hyperparameters(decay="number")
def measure_with_ema(measure: Callable[[Updates], PyTree], decay: float, debias: bool = True,
                     accumulator_dtype: Optional[Any] = None) -> GradientTransformation:
    """A measure for :func:`monitor`: the moving average of ``measure(updates)``.

    Its *output* is the measurement's average ``m_t = decay m_{t-1} + (1 -
    decay) measure(u_t)``, ``m_0 = 0``, divided by ``1 - decay**t`` when
    ``debias`` (so it is not biased towards 0 early on); use it inside
    :func:`monitor`, which passes the updates on.

    Args:
      measure: a function of the updates tree returning a tree of arrays (a
        norm, a bool such as ``norm > threshold``, ...).
      decay: the weight of the old average, in ``[0, 1]``.
      debias: divide by ``1 - decay**t``. Default ``True``.
      accumulator_dtype: the dtype the average is stored in; ``None``: the
        measurement's dtype, or float32 for bool and integer measurements.

    Returns:
      A ``GradientTransformation`` whose output is the average, and whose
      state is ``(EmptyState(), MeasureEmaState(count, ema))`` (optax's layout:
      a chain of the measure and an ``ema``).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.measure_with_ema(functrain.tree.norm, decay=0.5, debias=False)
    >>> avg, state = tx.update([jnp.array([3., 4.])], tx.init([jnp.zeros(2)]))
    >>> avg
    Array(2.5, dtype=float32)
    """
    if not callable(measure):
        raise TypeError(f"measure_with_ema: measure must be a function of the updates, got "
                        f"{type(measure).__name__}.")
    check_range("decay", decay, 0.0, 1.0, high_inclusive=True, owner="measure_with_ema")

    def float_dtype(x: Any) -> Any:
        dtype = jnp.asarray(x).dtype
        return dtype if jnp.issubdtype(dtype, jnp.inexact) else jnp.dtype(jnp.float32)

    def dtype_of(x: Any) -> Any:
        return float_dtype(x) if accumulator_dtype is None else accumulator_dtype

    def measure_fn(updates: Updates, state: OptState, params: Optional[Params] = None,
                   **extra_args: Any) -> tuple[PyTree, EmptyState]:
        return measure(updates), EmptyState()

    def ema_init(params: Params) -> MeasureEmaState:
        zeros = jax.tree_util.tree_map(lambda x: jnp.zeros(jnp.shape(x), dtype_of(x)),
                                       measure(params))
        return MeasureEmaState(count=jnp.zeros([], jnp.int32), ema=zeros)

    def ema_update_fn(values: PyTree, state: MeasureEmaState, params: Optional[Params] = None,
                      **extra_args: Any) -> tuple[PyTree, MeasureEmaState]:
        check_state_type(state, MeasureEmaState, "measure_with_ema")
        count = safe_increment(state.count)
        def average(x: Any, m: Array) -> Array:
            x = jnp.asarray(x)
            x = x.astype(jnp.promote_types(float_dtype(x), m.dtype))  # bools count as 0/1
            return ema_update(x, m, decay)

        new = jax.tree_util.tree_map(average, values, state.ema)
        out = new
        if debias:
            correction = bias_correction_factor(decay, count)
            out = jax.tree_util.tree_map(lambda m: (m / correction).astype(m.dtype), new)
        stored = jax.tree_util.tree_map(lambda n, m: n.astype(m.dtype), new, state.ema)
        return out, MeasureEmaState(count=count, ema=stored)

    return chain(GradientTransformation(lambda params: EmptyState(), measure_fn),
                 GradientTransformation(ema_init, ema_update_fn))
