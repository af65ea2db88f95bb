"""Schedules: functions of the step count that anneal a hyper-parameter.

Names, arguments, defaults and numbers are those of optax 0.2.8's schedules.
Each constructor returns a ``Schedule``: a function that maps a step count
(Python int or array, traced under ``jax.jit`` too) to a scalar. Where optax
silently replaces an argument (non-positive ``transition_steps``, negative
``transition_begin``) an absl INFO message is logged, as in optax; where optax
raises, a ``ValueError`` names the argument.
"""

from typing import Callable, Optional, Sequence

from absl import logging
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

Schedule = Callable[[ArrayLike], ArrayLike]


def _int_to_float(x: ArrayLike) -> ArrayLike:
    """Python ints become floats, so counts past 2**31 do not overflow int32."""
    return float(x) if isinstance(x, int) else x


def _in_count_float(value: ArrayLike, count: ArrayLike) -> ArrayLike:
    """``value`` promoted with the float type ``count`` brings into arithmetic.

    A float-array count (float32, bfloat16, ...) makes the result that dtype, as in optax's
    schedules whose formulas compute with the count; an integer count or a Python number
    leaves ``value`` as it is (a weak float stays weak, float64 under ``jax_enable_x64``).
    """
    dtype, weak = jax.dtypes.result_type(count, 0.0, return_weak_type_flag=True)
    return value if weak else value * jnp.ones((), dtype)


def _constant_init(init_value: ArrayLike, kind: str, reason: str) -> Schedule:
    logging.info(
        'A %s schedule was set with %s; this results in a constant schedule '
        'with value `init_value`.', kind, reason)
    return constant_schedule(init_value)


def _begin_at_least_zero(transition_begin: int, kind: str) -> int:
    if transition_begin < 0:
        logging.info(
            'A %s schedule was set with a negative `transition_begin` value; '
            '`transition_begin` falls back to `0`.', kind)
        return 0
    return transition_begin


def constant_schedule(value: ArrayLike) -> Schedule:
    """A schedule that returns ``value`` (unchanged) at every step.

    Args:
      value: the value held throughout.

    Returns:
      A ``Schedule``: ``count -> value``.

    Example:
      >>> sched = constant_schedule(0.1)
      >>> print(sched(0), sched(10**6))
      0.1 0.1
    """
    def schedule(count: ArrayLike) -> ArrayLike:
        del count
        return value
    return schedule


def polynomial_schedule(
    init_value: ArrayLike,
    end_value: ArrayLike,
    power: ArrayLike,
    transition_steps: int,
    transition_begin: int = 0,
) -> Schedule:
    """Polynomial transition from ``init_value`` to ``end_value``.

    With ``t = clip(count - transition_begin, 0, transition_steps)`` the value is
    ``end_value + (init_value - end_value) * (1 - t / transition_steps) ** power``:
    ``init_value`` up to ``transition_begin``, ``end_value`` from
    ``transition_begin + transition_steps`` on.

    Args:
      init_value: value before and at the start of the transition.
      end_value: value at and after the end of the transition.
      power: the power of the polynomial.
      transition_steps: length of the transition. If ``<= 0`` the schedule is
        the constant ``init_value``.
      transition_begin: steps during which ``init_value`` is held before the
        transition starts; a negative value is taken as 0.

    Returns:
      A ``Schedule``: a function of the step count returning a scalar.

    Example:
      >>> sched = polynomial_schedule(1.0, 0.0, power=2, transition_steps=10)
      >>> print(float(sched(0)), float(sched(5)), float(sched(20)))
      1.0 0.25 0.0
    """
    if transition_steps <= 0:
        return _constant_init(
            init_value, 'polynomial', 'a non-positive `transition_steps` value')
    transition_begin = _begin_at_least_zero(transition_begin, 'polynomial')

    def schedule(count: ArrayLike) -> ArrayLike:
        elapsed = jnp.clip(_int_to_float(count) - transition_begin, 0,
                           transition_steps)
        remaining = 1 - elapsed / transition_steps
        return (init_value - end_value) * remaining**power + end_value
    return schedule


def linear_schedule(
    init_value: ArrayLike,
    end_value: ArrayLike,
    transition_steps: int,
    transition_begin: int = 0,
) -> Schedule:
    """Linear transition from ``init_value`` to ``end_value``.

    :func:`polynomial_schedule` with ``power=1``.

    Args:
      init_value: value before and at the start of the transition.
      end_value: value at and after the end of the transition.
      transition_steps: length of the transition. If ``<= 0`` the schedule is
        the constant ``init_value``.
      transition_begin: steps during which ``init_value`` is held before the
        transition starts; a negative value is taken as 0.

    Returns:
      A ``Schedule``: a function of the step count returning a scalar.

    Example:
      >>> sched = linear_schedule(1.0, 0.5, transition_steps=10,
      ...                         transition_begin=5)
      >>> print(float(sched(5)), float(sched(10)), float(sched(100)))
      1.0 0.75 0.5
    """
    return polynomial_schedule(init_value, end_value, 1, transition_steps,
                               transition_begin)


def piecewise_constant_schedule(
    init_value: ArrayLike,
    boundaries_and_scales: Optional[dict[int, float]] = None,
) -> Schedule:
    """``init_value`` times the scales of all boundaries reached so far.

    At step ``count`` the value is ``init_value`` multiplied by every ``scale``
    of ``boundaries_and_scales`` whose ``boundary <= count``.

    Args:
      init_value: the value before the first boundary.
      boundaries_and_scales: ``{boundary_step: scale}``; scales must be
        non-negative. ``None`` (the default) means none: a constant schedule.

    Returns:
      A ``Schedule``: a function of the step count returning a scalar.

    Raises:
      ValueError: if a scale is negative (or NaN).

    Example:
      >>> sched = piecewise_constant_schedule(1.0, {10: 0.5, 20: 0.5})
      >>> print(float(sched(9)), float(sched(10)), float(sched(25)))
      1.0 0.5 0.25
    """
    steps = sorted((boundaries_and_scales or {}).items())
    bad = [scale for _, scale in steps if not scale >= 0.0]
    if bad:
        raise ValueError('piecewise_constant_schedule expects non-negative scale '
                         f'factors in boundaries_and_scales, got {bad}.')

    def schedule(count: ArrayLike) -> ArrayLike:
        value = init_value
        for boundary, scale in steps:
            value = jnp.where(count >= boundary, scale * value, value)
        return _in_count_float(value, count) if steps else value
    return schedule


def exponential_decay(
    init_value: ArrayLike,
    transition_steps: int,
    decay_rate: float,
    transition_begin: int = 0,
    staircase: bool = False,
    end_value: Optional[ArrayLike] = None,
) -> Schedule:
    """Continuous or staircase exponential decay.

    With ``t = count - transition_begin`` the value is ``init_value`` for
    ``t <= 0`` and ``init_value * decay_rate ** (t / transition_steps)`` after
    (the exponent rounded down if ``staircase``). If ``end_value`` is given the
    result is then bounded by it: from below when ``decay_rate < 1``, from above
    otherwise (before the transition too).

    Args:
      init_value: the initial value.
      transition_steps: steps per factor of ``decay_rate``. If ``<= 0`` the
        schedule is the constant ``init_value``.
      decay_rate: the decay rate. If 0 the schedule is the constant
        ``init_value``.
      transition_begin: steps during which ``init_value`` is held before the
        decay starts; a negative value is taken as 0.
      staircase: if True, decay at discrete intervals of ``transition_steps``.
      end_value: optional bound on the value (see above); ``None`` (the
        default) means no bound.

    Returns:
      A ``Schedule``: a function of the step count returning a scalar.

    Example:
      >>> sched = exponential_decay(1.0, transition_steps=10, decay_rate=0.5)
      >>> print(float(sched(10)), float(sched(15)), float(sched(20)))
      0.5 0.3535... 0.25
    """
    if transition_steps <= 0:
        return _constant_init(init_value, 'exponential',
                              'a non-positive `transition_steps` value')
    if decay_rate == 0:
        return _constant_init(init_value, 'exponential', 'a zero `decay_rate`')
    transition_begin = _begin_at_least_zero(transition_begin, 'exponential')
    bound = jnp.maximum if decay_rate < 1.0 else jnp.minimum

    def schedule(count: ArrayLike) -> ArrayLike:
        elapsed = _int_to_float(count) - transition_begin
        exponent = elapsed / transition_steps
        if staircase:
            exponent = jnp.floor(exponent)
        value = jnp.where(elapsed <= 0, init_value,
                          init_value * jnp.power(decay_rate, exponent))
        return value if end_value is None else bound(value, end_value)
    return schedule


def cosine_decay_schedule(
    init_value: ArrayLike,
    decay_steps: int,
    alpha: ArrayLike = 0.0,
    exponent: ArrayLike = 1.0,
) -> Schedule:
    """Cosine decay from ``init_value`` to ``alpha * init_value``.

    With ``t = min(count, decay_steps)`` and
    ``c = (1 + cos(pi * t / decay_steps)) / 2`` the value is
    ``init_value * ((1 - alpha) * c ** exponent + alpha)``. As in optax, the
    count is not clipped from below: a negative count gives the value at
    ``|count|`` (the cosine is even) for ``-decay_steps <= count < 0``.

    Args:
      init_value: the initial value.
      decay_steps: positive number of steps of the decay.
      alpha: the final value as a fraction of ``init_value``.
      exponent: the power applied to ``c``.

    Returns:
      A ``Schedule``: a function of the step count returning a scalar.

    Raises:
      ValueError: if ``decay_steps <= 0``.

    Example:
      >>> sched = cosine_decay_schedule(1.0, decay_steps=10, alpha=0.1)
      >>> print(float(sched(0)), float(sched(5)), float(sched(30)))
      1.0 0.55 0.1
    """
    if not decay_steps > 0:
        raise ValueError('cosine_decay_schedule requires a positive decay_steps, '
                         f'got decay_steps={decay_steps!r}.')
    decay_steps = _int_to_float(decay_steps)

    def schedule(count: ArrayLike) -> ArrayLike:
        t = jnp.minimum(_int_to_float(count), decay_steps)
        c = 0.5 * (1 + jnp.cos(jnp.pi * t / decay_steps))
        return init_value * ((1 - alpha) * c**exponent + alpha)
    return schedule


def join_schedules(schedules: Sequence[Schedule],
                   boundaries: Sequence[int]) -> Schedule:
    """Runs ``schedules`` one after another, switching at ``boundaries``.

    For ``boundaries[i-1] <= count < boundaries[i]`` the value is
    ``schedules[i](count - boundaries[i-1])``: each schedule counts from its own
    start. ``boundaries`` should be increasing and one shorter than
    ``schedules``. Unlike optax, which silently ignores extra entries of
    either, a length mismatch is a ``ValueError``.

    Args:
      schedules: the schedules, in order.
      boundaries: the steps at which to move to the next schedule.

    Returns:
      A ``Schedule``: a function of the step count returning a scalar.

    Raises:
      ValueError: if ``len(boundaries) != len(schedules) - 1``.

    Example:
      >>> sched = join_schedules(
      ...     [constant_schedule(1.0), linear_schedule(1.0, 0.0, 10)], [5])
      >>> print(float(sched(4)), float(sched(5)), float(sched(10)))
      1.0 1.0 0.5
    """
    if len(boundaries) != len(schedules) - 1:
        raise ValueError(
            f"join_schedules: boundaries must be one shorter than schedules, got "
            f"{len(boundaries)} boundaries for {len(schedules)} schedules.")

    def schedule(count: ArrayLike) -> ArrayLike:
        value = schedules[0](count)
        for boundary, later in zip(boundaries, schedules[1:]):
            value = jnp.where(count < boundary, value, later(count - boundary))
        return value
    return schedule


def warmup_constant_schedule(
    init_value: ArrayLike,
    peak_value: ArrayLike,
    warmup_steps: int,
) -> Schedule:
    """Linear warmup from ``init_value`` to ``peak_value``, then constant.

    Args:
      init_value: the value at step 0.
      peak_value: the value from ``warmup_steps`` on.
      warmup_steps: length of the warmup. If ``<= 0`` the schedule is the
        constant ``init_value`` (as in optax).

    Returns:
      A ``Schedule``: a function of the step count returning a scalar.

    Example:
      >>> sched = warmup_constant_schedule(0.0, 1.0, warmup_steps=4)
      >>> print(float(sched(1)), float(sched(4)), float(sched(100)))
      0.25 1.0 1.0
    """
    return linear_schedule(init_value, peak_value, warmup_steps)


def warmup_cosine_decay_schedule(
    init_value: ArrayLike,
    peak_value: ArrayLike,
    warmup_steps: int,
    decay_steps: int,
    end_value: ArrayLike = 0.0,
    exponent: ArrayLike = 1.0,
) -> Schedule:
    """Linear warmup to ``peak_value``, then cosine decay to ``end_value``.

    The warmup is :func:`linear_schedule` over ``warmup_steps``; from step
    ``warmup_steps`` on, :func:`cosine_decay_schedule` with ``init_value =
    peak_value``, ``decay_steps = decay_steps - warmup_steps`` and ``alpha =
    end_value / peak_value`` (0 if ``peak_value == 0``, so that the decay then
    ends at 0 whatever ``end_value``) counts from ``warmup_steps``.

    Args:
      init_value: the value at step 0.
      peak_value: the value at the end of the warmup.
      warmup_steps: length of the warmup.
      decay_steps: total length of the schedule, warmup included.
      end_value: the value from ``decay_steps`` on.
      exponent: the power applied to the cosine factor, see
        :func:`cosine_decay_schedule`.

    Returns:
      A ``Schedule``: a function of the step count returning a scalar.

    Raises:
      ValueError: if ``decay_steps <= warmup_steps``.

    Example:
      >>> sched = warmup_cosine_decay_schedule(0.0, 1.0, warmup_steps=10,
      ...                                      decay_steps=30, end_value=0.1)
      >>> print(float(sched(5)), float(sched(10)), float(sched(20)),
      ...       float(sched(99)))
      0.5 1.0 0.55 0.1
    """
    if not decay_steps - warmup_steps > 0:
        raise ValueError(
            'warmup_cosine_decay_schedule requires decay_steps > warmup_steps '
            '(the cosine part lasts decay_steps - warmup_steps), got '
            f'decay_steps={decay_steps!r}, warmup_steps={warmup_steps!r}.')
    alpha = 0.0 if peak_value == 0.0 else end_value / peak_value
    return join_schedules(
        [linear_schedule(init_value, peak_value, warmup_steps),
         cosine_decay_schedule(peak_value, decay_steps - warmup_steps, alpha,
                               exponent)],
        [warmup_steps])


def piecewise_interpolate_schedule(
    interpolate_type: str,
    init_value: ArrayLike,
    boundaries_and_scales: Optional[dict[int, float]] = None,
) -> Schedule:
    """Interpolation between the values reached at the boundaries, linear or cosine.

    The value at boundary ``b_i`` (sorted) is ``v_i = init_value`` times the
    scales of the boundaries up to ``b_i``; between ``b_i`` and ``b_{i+1}`` it
    moves from ``v_i`` to ``v_{i+1}`` linearly, or as ``v_{i+1} + (v_i -
    v_{i+1}) (1 + cos(pi t)) / 2`` with ``t`` the fraction of the interval
    passed. It starts from ``init_value`` at step 0, holds the last value
    after the last boundary, and (as in optax) is 0 at negative counts.

    Args:
      interpolate_type: ``'linear'`` or ``'cosine'``.
      init_value: the value at step 0.
      boundaries_and_scales: ``{boundary_step: scale}``, scales non-negative;
        ``None`` (the default) or empty: the constant ``init_value``.

    Returns:
      A ``Schedule``: a function of the step count returning a scalar.

    Raises:
      ValueError: for another ``interpolate_type`` or a negative scale.

    Example:
      >>> sched = piecewise_interpolate_schedule('linear', 1.0, {4: 0.1, 8: 0.01})
      >>> print(float(sched(2)), float(sched(4)), float(sched(20)))
      0.55 0.1 0.001
    """
    if interpolate_type not in ('linear', 'cosine'):
        raise ValueError("piecewise_interpolate_schedule: interpolate_type must be "
                         f"'linear' or 'cosine', got {interpolate_type!r}.")
    steps = sorted((boundaries_and_scales or {}).items())
    bad = [scale for _, scale in steps if not scale >= 0.0]
    if bad:
        raise ValueError('piecewise_interpolate_schedule expects non-negative scale '
                         f'factors in boundaries_and_scales, got {bad}.')
    starts = [0] + [b for b, _ in steps]

    def between(start: ArrayLike, end: ArrayLike, fraction: ArrayLike) -> ArrayLike:
        if interpolate_type == 'linear':
            return start + (end - start) * fraction
        return end + (start - end) / 2.0 * (1 + jnp.cos(jnp.pi * fraction))

    def schedule(count: ArrayLike) -> ArrayLike:
        # The values at the boundaries, a running product in the value's dtype.
        values = jnp.cumprod(jnp.stack([jnp.asarray(init_value)]
                                       + [jnp.asarray(s) for _, s in steps]))
        # Python-int boundaries keep the count's integer type in ``count - start``
        # (an int32 count gives a float32 fraction under x64, as in optax).
        count = jnp.asarray(count)
        value = jnp.where(count >= starts[-1], values[-1], 0.0)
        for i, (start, end) in enumerate(zip(starts, starts[1:])):
            inside = jnp.logical_and(count >= start, count < end)
            part = between(values[i], values[i + 1], (count - start) / max(end - start, 1))
            value = jnp.where(inside, part, value)
        return value
    return schedule


def linear_onecycle_schedule(
    transition_steps: int,
    peak_value: ArrayLike,
    pct_start: float = 0.3,
    pct_final: float = 0.85,
    div_factor: float = 25.0,
    final_div_factor: float = 1e4,
) -> Schedule:
    """The one-cycle policy with linear phases (Smith and Topin, 2017, "Super-Convergence").

    With ``T = transition_steps`` and ``v0 = peak_value / div_factor``: linear
    from ``v0`` up to ``peak_value`` until step ``int(pct_start * T)``, back
    down to ``v0`` until step ``int(pct_final * T)``, then down to ``v0 /
    final_div_factor`` at step ``T``, held after. Paper: Smith and Topin,
    "Super-Convergence: Very Fast Training of Neural Networks Using Large
    Learning Rates" (2017).

    Args:
      transition_steps: the length of the cycle, ``> 0``.
      peak_value: the largest value, at ``pct_start`` of the cycle.
      pct_start: the fraction of the cycle spent increasing.
      pct_final: the fraction of the cycle at which the value is back at ``v0``.
      div_factor: ``v0 = peak_value / div_factor``.
      final_div_factor: the final value is ``v0 / final_div_factor``.

    Returns:
      A ``Schedule``: a function of the step count returning a scalar.

    Raises:
      ValueError: if ``transition_steps <= 0``.

    Example:
      >>> sched = linear_onecycle_schedule(100, 1.0, div_factor=10.0)
      >>> print(float(sched(0)), float(sched(30)), float(sched(85)))
      0.1 1.0 0.1
    """
    if not transition_steps > 0:
        raise ValueError('linear_onecycle_schedule requires a positive transition_steps, '
                         f'got transition_steps={transition_steps!r}.')
    return piecewise_interpolate_schedule(
        'linear', peak_value / div_factor,
        {int(pct_start * transition_steps): div_factor,
         int(pct_final * transition_steps): 1.0 / div_factor,
         transition_steps: 1.0 / final_div_factor})


def cosine_onecycle_schedule(
    transition_steps: int,
    peak_value: ArrayLike,
    pct_start: float = 0.3,
    div_factor: float = 25.0,
    final_div_factor: float = 1e4,
) -> Schedule:
    """The one-cycle policy with cosine phases (Smith and Topin, 2017, "Super-Convergence").

    With ``T = transition_steps`` and ``v0 = peak_value / div_factor``: a
    cosine rise from ``v0`` to ``peak_value`` until step ``int(pct_start *
    T)``, then a cosine fall to ``v0 / final_div_factor`` at step ``T``, held
    after. Paper: Smith and Topin, "Super-Convergence: Very Fast Training of
    Neural Networks Using Large Learning Rates" (2017).

    Args:
      transition_steps: the length of the cycle, ``> 0``.
      peak_value: the largest value, at ``pct_start`` of the cycle.
      pct_start: the fraction of the cycle spent increasing.
      div_factor: ``v0 = peak_value / div_factor``.
      final_div_factor: the final value is ``v0 / final_div_factor``.

    Returns:
      A ``Schedule``: a function of the step count returning a scalar.

    Raises:
      ValueError: if ``transition_steps <= 0``.

    Example:
      >>> sched = cosine_onecycle_schedule(100, 1.0, div_factor=10.0)
      >>> print(float(sched(0)), float(sched(15)), float(sched(30)))
      0.1 0.55 1.0
    """
    if not transition_steps > 0:
        raise ValueError('cosine_onecycle_schedule requires a positive transition_steps, '
                         f'got transition_steps={transition_steps!r}.')
    return piecewise_interpolate_schedule(
        'cosine', peak_value / div_factor,
        {int(pct_start * transition_steps): div_factor,
         int(transition_steps): 1.0 / (div_factor * final_div_factor)})


def warmup_exponential_decay_schedule(
    init_value: ArrayLike,
    peak_value: ArrayLike,
    warmup_steps: int,
    transition_steps: int,
    decay_rate: ArrayLike,
    transition_begin: int = 0,
    staircase: bool = False,
    end_value: Optional[ArrayLike] = None,
) -> Schedule:
    """Linear warmup to ``peak_value``, then :func:`exponential_decay` from it.

    The warmup is :func:`linear_schedule` over ``warmup_steps``; from step
    ``warmup_steps`` on, ``exponential_decay(peak_value, transition_steps,
    decay_rate, transition_begin, staircase, end_value)`` counts from
    ``warmup_steps``.

    Args:
      init_value: the value at step 0.
      peak_value: the value at the end of the warmup.
      warmup_steps: length of the warmup.
      transition_steps: steps per factor of ``decay_rate`` (see
        :func:`exponential_decay`).
      decay_rate: the decay rate.
      transition_begin: steps after the warmup during which ``peak_value`` is
        held before the decay starts.
      staircase: decay at discrete intervals of ``transition_steps``.
      end_value: optional bound of the decay (see :func:`exponential_decay`).

    Returns:
      A ``Schedule``: a function of the step count returning a scalar.

    Example:
      >>> sched = warmup_exponential_decay_schedule(0.0, 1.0, warmup_steps=10,
      ...                                           transition_steps=10, decay_rate=0.5)
      >>> print(float(sched(5)), float(sched(10)), float(sched(20)))
      0.5 1.0 0.5
    """
    return join_schedules(
        [linear_schedule(init_value, peak_value, warmup_steps),
         exponential_decay(peak_value, transition_steps, decay_rate, transition_begin,
                           staircase, end_value)],
        [warmup_steps])


def sgdr_schedule(cosine_kwargs: Sequence[dict]) -> Schedule:
    """SGD with warm restarts (Loshchilov and Hutter, 2017): cosine cycles one after another.

    Each dict of ``cosine_kwargs`` holds the arguments of one
    :func:`warmup_cosine_decay_schedule` cycle; its ``decay_steps`` is the
    cycle's length, so the next cycle starts (counting from 0 again) when it
    ends. Paper: Loshchilov and Hutter, "SGDR: Stochastic Gradient Descent
    with Warm Restarts" (2017).

    Args:
      cosine_kwargs: the cycles, each a dict of
        :func:`warmup_cosine_decay_schedule` arguments with ``decay_steps``.

    Returns:
      A ``Schedule``: a function of the step count returning a scalar.

    Raises:
      ValueError: if ``cosine_kwargs`` is empty or a cycle lacks
        ``decay_steps``.

    Example:
      >>> cycle = dict(init_value=0.0, peak_value=1.0, warmup_steps=2, decay_steps=10)
      >>> sched = sgdr_schedule([cycle, cycle])
      >>> print(float(sched(2)), float(sched(10)), float(sched(12)))
      1.0 0.0 1.0
    """
    cycles = list(cosine_kwargs)
    if not cycles:
        raise ValueError('sgdr_schedule: cosine_kwargs must hold at least one cycle.')
    schedules, boundaries, end = [], [], 0
    for i, kwargs in enumerate(cycles):
        if 'decay_steps' not in kwargs:
            raise ValueError(f'sgdr_schedule: cosine_kwargs[{i}] has no decay_steps (the '
                             f'length of the cycle), got keys {sorted(kwargs)}.')
        schedules.append(warmup_cosine_decay_schedule(**kwargs))
        end += kwargs['decay_steps']
        boundaries.append(end)
    return join_schedules(schedules, boundaries[:-1])
