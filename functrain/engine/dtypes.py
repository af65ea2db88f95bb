"""The engine's dtype policy: what dtype one leaf's math runs in, its state is read in,
and its update comes out in.

* :func:`leaf_compute_dtype`: grads promoted with params, 16-bit floats as float32.
* :func:`state_compute_dtype`: a state leaf is read in at least that dtype (bfloat16
  moments computed in float32, stored in bfloat16); non-float state keeps its dtype.
* :func:`params_float_dtype`: the dtype of a transformation's scalar state kept "in the
  params' dtype" (schedule-free's ``b1``, reduce_on_plateau's ``scale``), integer params
  counted as their float (optax's would round ``b1 = 0.9`` to 0).
* :func:`integer_float`: an integer leaf that a stage does arithmetic on is computed, and
  its update returned, in the float jnp's arithmetic gives it (``0.1 * g``: float32,
  float64 with x64), as optax's updates come out. Which integer leaves a stage accepts at
  all is :func:`functrain.tree.check_leaf_dtypes`'s to say.

:mod:`functrain.engine.program` applies them in its per-leaf pass.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from functrain import tree as ft

__all__ = ["leaf_compute_dtype", "state_compute_dtype", "integer_float",
           "integers_as_floats", "params_float_dtype"]


def leaf_compute_dtype(g: Any, p: Optional[Any]) -> Any:
    """The dtype one leaf's math runs in: grads promoted with params, 16-bit as float32.

    Args:
      g: the update leaf (anything with a ``dtype``).
      p: the parameter leaf, or ``None``.

    Returns:
      A numpy dtype.

    >>> import jax.numpy as jnp
    >>> leaf_compute_dtype(jnp.ones(1, jnp.bfloat16), None)
    dtype('float32')
    """
    return ft.compute_dtype(g.dtype if p is None else jnp.promote_types(g.dtype, p.dtype))


def state_compute_dtype(x: jax.Array, cd: Any) -> Any:
    """The dtype a state leaf is read in: at least the leaf math's dtype ``cd``.

    Args:
      x: a state leaf (e.g. a bfloat16 moment).
      cd: the leaf's compute dtype.

    Returns:
      A numpy dtype (non-float state keeps its own dtype).

    >>> import jax.numpy as jnp
    >>> state_compute_dtype(jnp.ones(1, jnp.bfloat16), jnp.float32)
    dtype('float32')
    """
    if jnp.issubdtype(x.dtype, jnp.floating):
        return jnp.promote_types(ft.compute_dtype(x.dtype), cd)
    return x.dtype


def integer_float(x: Any) -> Optional[Any]:
    """The float an integer (not bool) leaf is computed in, as jnp's ``0.1 * x`` gives it.

    Args:
      x: a leaf (anything with a ``dtype``).

    Returns:
      float32 (float64 with x64) for an integer ``x``; ``None`` for any other dtype.

    >>> import jax.numpy as jnp
    >>> integer_float(jnp.ones(2, jnp.int8)), integer_float(jnp.ones(2))
    (dtype('float32'), None)
    """
    if jnp.issubdtype(x.dtype, jnp.integer):
        return jnp.result_type(x.dtype, float)
    return None


def integers_as_floats(leaves: Sequence[Any], which: Sequence[bool]) -> list:
    """``leaves``, each integer one where ``which`` is True cast to :func:`integer_float`.

    Args:
      leaves: arrays.
      which: one bool per leaf: whether a stage does arithmetic on it.

    Returns:
      A list of the leaves (the others unchanged).

    >>> import jax.numpy as jnp
    >>> [x.dtype.name for x in integers_as_floats([jnp.ones(1, jnp.int32)] * 2, [True, False])]
    ['float32', 'int32']
    """
    return [x.astype(integer_float(x)) if on and integer_float(x) is not None else x
            for x, on in zip(leaves, which)]


def params_float_dtype(params: Any, mixed_dtype_handler: str) -> Any:
    """:func:`functrain.tree.dtype` of ``params``, each integer leaf counted as the float
    it is computed in (:func:`integer_float`): the dtype of scalar state kept in the params'
    dtype, which an integer would truncate.

    Args:
      params: a tree of arrays or Python numbers.
      mixed_dtype_handler: ``'lowest'``, ``'highest'`` or ``'promote'``.

    Returns:
      A numpy dtype.

    >>> import jax.numpy as jnp
    >>> params_float_dtype({'n': jnp.ones(2, jnp.int32), 'h': jnp.ones(2, jnp.float16)},
    ...                    'lowest')
    dtype('float16')
    >>> params_float_dtype({'n': 1}, 'lowest')
    dtype('float32')
    """
    def as_float(x: Any) -> np.ndarray:
        dtype = np.dtype(x.dtype) if hasattr(x, "dtype") else jnp.result_type(x)
        return np.zeros((), integer_float(jax.ShapeDtypeStruct((), dtype)) or dtype)

    return ft.dtype(jax.tree_util.tree_map(as_float, params), mixed_dtype_handler)
