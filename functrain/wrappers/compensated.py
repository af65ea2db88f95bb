"""16-bit parameters that train as float32 master weights: compensated updates.

A bfloat16 weight near 1 cannot move by less than half its spacing, ``2**-9``: an update
smaller than that is rounded away, and small learning rates stall. Mixed-precision training
keeps a float32 master copy of every weight (4 more bytes per parameter) for that reason.
:func:`compensated_params` keeps, instead, the rounding error of each 16-bit weight in a
16-bit side buffer (Kahan's compensated summation, as FlashOptim and HeavyBall do for
bfloat16 weights): the weight plus its compensation is the master value, to about 16
significant bits, and every update is applied to it.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain.arg_checks import check_state_type, check_transformation, needs_params_error
from functrain import tree as ft
from functrain.engine.protocol import (GradientTransformationExtraArgs, OptState, Params,
                                       Updates, call_update)

#: The parameter dtypes whose leaves are compensated; others are updated as they are.
COMPENSATED_DTYPES = (jnp.bfloat16, jnp.float16)


class CompensatedParamsState(NamedTuple):
    """The state of :func:`compensated_params`.

    Attributes:
      inner_state: the wrapped optimizer's state, made from the float32 master values.
      compensation: a tree like the params: for each bfloat16 or float16 leaf, what its
        master value exceeds the stored weight by (in ``compensation_dtype``; for ``int8``
        in 127ths of half the weight's spacing); a
        ``MaskedNode`` for every other leaf.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.compensated_params(functrain.sgd(0.1))
    >>> opt.init({'w': jnp.ones(2, jnp.bfloat16)}).compensation
    {'w': Array([0, 0], dtype=bfloat16)}
    """

    inner_state: OptState
    compensation: Any


def _is_compensated(p: Any) -> bool:
    return hasattr(p, "dtype") and jnp.dtype(p.dtype) in [jnp.dtype(d) for d in
                                                           COMPENSATED_DTYPES]


def _half_spacing(w: jax.Array) -> jax.Array:
    """Half the spacing of ``w``'s dtype just above ``|w|``: ``2**(e - p)`` for ``|w|`` in
    ``[2**e, 2**(e + 1))`` and ``p`` significant bits, a bound on ``|t - w|`` when ``w`` is ``t``
    rounded to nearest (below a power of two the spacing halves, so the bound still holds);
    the smallest normal float32 for zero and subnormal weights.

    Read from the exponent bits (frexp and ldexp's special cases made the compiler keep a
    float32 copy of a whole stacked leaf: 0.5 GB more temp for a (8, 2048, 8192) weight)."""
    bits = jnp.finfo(w.dtype).nmant + 1
    field = (jax.lax.bitcast_convert_type(w.astype(jnp.float32), jnp.uint32) >> 23) & 0xFF
    half = jnp.maximum(field.astype(jnp.int32) - bits, 1).astype(jnp.uint32) << 23
    return jax.lax.bitcast_convert_type(half, jnp.float32)


def _encode_int8(error: jax.Array, w: jax.Array) -> jax.Array:
    """A rounding error ``|error| <= _half_spacing(w)`` in 127ths of that bound, as int8."""
    k = jnp.round(error / _half_spacing(w) * 127)
    return jnp.where(jnp.isfinite(k), jnp.clip(k, -127, 127), 0).astype(jnp.int8)


def _decode(c: jax.Array, w: jax.Array) -> jax.Array:
    if c.dtype == jnp.int8:
        return c.astype(jnp.float32) * (_half_spacing(w) / 127)
    return c.astype(jnp.float32)


def compensated_master(params: Params, state: "CompensatedParamsState") -> Params:
    """The master values :func:`compensated_params` steps: each 16-bit weight plus its
    compensation, in float32 (other leaves as they are). Evaluate or export with these when
    the 16-bit weights are not enough.

    Args:
      params: the parameters.
      state: their :class:`CompensatedParamsState`.

    Returns:
      A tree like ``params``: float32 for the compensated leaves.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.compensated_params(functrain.sgd(1e-3), jnp.int8)
    >>> params = {'w': jnp.ones(2, jnp.bfloat16)}
    >>> updates, state = opt.update({'w': jnp.ones(2)}, opt.init(params), params)
    >>> functrain.compensated_master(functrain.apply_updates(params, updates), state)['w']
    Array([0.998985, 0.998985], dtype=float32)

    (0.999, the weight 1.0 and its error -0.001 in 127ths of ``2**-8``: -33.)
    """
    return jax.tree.map(lambda p, c: p if ft.is_placeholder(c) else
                        p.astype(jnp.float32) + _decode(c, p),
                        params, state.compensation, is_leaf=ft.is_placeholder)


def compensated_params(inner: Any, compensation_dtype: Any = jnp.bfloat16
                       ) -> GradientTransformationExtraArgs:
    """Train 16-bit parameters as float32 master weights, at 2 bytes more per parameter.

    For each bfloat16 or float16 parameter ``p`` with compensation ``c``, per step: the
    master value is ``m = float32(p) + float32(c)``; ``inner`` steps ``m`` with the
    gradient in float32 (its state is made from the master values, so it is float32 as a
    float32 model's); ``t = m + u``; the new weight is ``t`` rounded to ``p``'s dtype, and the
    returned update (in ``p``'s dtype, as optax's) is its difference from ``p``, which
    :func:`functrain.apply_updates` (optax's ``apply_updates`` too) turns into that weight
    (exactly unless the weight changes by more than a factor 2); the new compensation is
    ``t`` less the weight ``apply_updates`` makes, rounded to ``compensation_dtype``. So ``p + c`` follows float32 master
    weights within the compensation's rounding (``|c| 2**-9`` for bfloat16: ``m`` keeps about
    16 significant bits where the weight alone keeps 8; ``int8`` keeps the error in 127ths of
    its bound, half the weight's spacing, about 15 bits in all). Leaves of any other dtype are
    stepped by ``inner`` as they are. Kahan, 1965, "Further remarks on reducing truncation
    errors"; the same compensation as FlashOptim (arXiv 2602.23349) and HeavyBall keep for
    bfloat16 weights.

    Memory per parameter: the 16-bit weight and its 16-bit compensation (4 bytes, where
    float32 master weights beside 16-bit ones take 6; 3 with an ``int8`` compensation), plus
    ``inner``'s state; with ``quantized_state(adamw(...), bits=8)`` as ``inner`` and an
    ``int8`` compensation, 5 bytes in all.

    Use it as the outermost transformation (the updates it returns are sized for the
    weights it keeps), and pass the params to ``update``. Any optimizer works as
    ``inner``: its ``params`` are the master values, so weight decay and trust ratios see
    them.

    Args:
      inner: the optimizer (any ``GradientTransformation``, optax's too).
      compensation_dtype: the dtype of the compensation: ``jnp.bfloat16`` (default: its
        exponent range covers every bfloat16 or float16 weight's rounding error),
        ``jnp.float16``, ``jnp.float32`` (the float32 master weights exactly) or ``jnp.int8``
        (1 byte: the error in 127ths of half the weight's spacing, as HeavyBall's and
        FlashOptim's 8-bit error terms).

    Returns:
      A transformation whose state is :class:`CompensatedParamsState`.

    >>> import jax, jax.numpy as jnp, functrain
    >>> opt = functrain.compensated_params(functrain.sgd(1e-3))
    >>> params = {'w': jnp.ones(3, jnp.bfloat16)}
    >>> state = opt.init(params)
    >>> for _ in range(4):  # each step moves w by 1e-3, a quarter of bfloat16's spacing at 1
    ...     updates, state = opt.update({'w': jnp.ones(3, jnp.bfloat16)}, state, params)
    ...     params = functrain.apply_updates(params, updates)
    >>> params['w'], params['w'][0] + state.compensation['w'][0]  # plain bf16 would stay at 1
    (Array([0.996094, 0.996094, 0.996094], dtype=bfloat16), Array(0.996, dtype=bfloat16))
    """
    check_transformation(inner, "compensated_params")
    try:
        c_dtype = jnp.dtype(compensation_dtype)
    except TypeError:
        c_dtype = None
    if c_dtype not in [jnp.dtype(d) for d in (jnp.bfloat16, jnp.float16, jnp.float32, jnp.int8)]:
        raise ValueError(f"compensated_params: compensation_dtype must be jnp.bfloat16, "
                         f"jnp.float16, jnp.float32 or jnp.int8, got {compensation_dtype!r}.")
    encode = (_encode_int8 if c_dtype == jnp.dtype(jnp.int8) else
              lambda e, w: e.astype(c_dtype))

    def master(params: Params, compensation: Any) -> Params:
        return compensated_master(params, CompensatedParamsState(None, compensation))

    def init_fn(params: Params) -> CompensatedParamsState:
        compensation = jax.tree.map(
            lambda p: jnp.zeros(p.shape, c_dtype) if _is_compensated(p) else ft.MaskedNode(),
            params)
        return CompensatedParamsState(inner.init(master(params, compensation)), compensation)

    def update_fn(updates: Updates, state: CompensatedParamsState,
                  params: Optional[Params] = None, **extra_args: Any
                  ) -> tuple[Updates, CompensatedParamsState]:
        check_state_type(state, CompensatedParamsState, "compensated_params")
        if params is None:
            raise needs_params_error("compensated_params")
        ft.check_structure(params, updates, "updates", "params")
        m = master(params, state.compensation)
        grads = jax.tree.map(lambda g, c: g if ft.is_placeholder(c) else g.astype(jnp.float32),
                             updates, state.compensation, is_leaf=ft.is_placeholder)
        u, inner_state = call_update(inner, grads, state.inner_state, m, extra_args)

        ps, treedef = jax.tree_util.tree_flatten(params)
        outs, comps = [], []
        for p, c, m_, u_ in zip(ps, *(treedef.flatten_up_to(t) for t in
                                      (state.compensation, m, u))):
            if ft.is_placeholder(c):
                outs.append(u_)
                comps.append(c)
                continue
            target = m_ + u_.astype(jnp.float32)
            # In the weight's dtype, as optax's updates are: the difference of the new and
            # the old weight, exact when they are within a factor 2 (Sterbenz); the
            # compensation takes what apply_updates makes of it either way.
            update = (target.astype(p.dtype).astype(jnp.float32)
                      - p.astype(jnp.float32)).astype(p.dtype)
            applied = (p + update).astype(p.dtype)  # what apply_updates makes of it
            outs.append(update)
            comps.append(encode(target - applied.astype(jnp.float32), applied))
        return (treedef.unflatten(outs),
                CompensatedParamsState(inner_state, treedef.unflatten(comps)))

    return GradientTransformationExtraArgs(init_fn, update_fn)


__all__ = ["COMPENSATED_DTYPES", "CompensatedParamsState", "compensated_master",
           "compensated_params"]
