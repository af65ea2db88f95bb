"""optax's older module name ``optax.tree_utils``: its ``tree_*`` names, as aliases.

``import functrain.tree_utils as otu`` runs code written for ``import
optax.tree_utils as otu``: each ``tree_<name>`` that optax 0.2.8 still exports
there is :mod:`functrain.tree`'s ``<name>``, the same function (``tree_add`` is
``functrain.tree.add``, ``tree_get`` is ``functrain.tree.get``, ``tree_map_params`` is
``functrain.tree.map_params``, which is also ``functrain.tree_map_params``), and
``NamedTupleKey`` is ``functrain.tree.NamedTupleKey``, which compares and hashes equal to
optax's ``optax.tree_utils.NamedTupleKey`` of the same fields (functrain never imports
optax; only ``isinstance`` tells the two classes apart), so the paths ``tree_get_all_with_path``
reports equal optax's for the same state. The names optax 0.2.8
keeps only as deprecated (``tree_scalar_mul``, ``tree_add_scalar_mul``,
``tree_l1_norm``, ``tree_l2_norm``, ``tree_linf_norm``) work too, with optax's
``DeprecationWarning``. Nothing here computes anything of its own; new code
should use :mod:`functrain.tree` (whose functions are defined in it and in
:mod:`functrain.tree.ops`, :mod:`functrain.tree.state` and
:mod:`functrain.tree.checks`).

>>> import jax.numpy as jnp, functrain
>>> import functrain.tree_utils as otu
>>> otu.tree_sub({'a': jnp.ones(2)}, {'a': jnp.full(2, 3.0)})
{'a': Array([-2., -2.], dtype=float32)}
>>> otu.tree_get is functrain.tree.get
True
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

from functrain.tree import NamedTupleKey
from functrain.tree import add as tree_add
from functrain.tree import add_scale as tree_add_scale
from functrain.tree import allclose as tree_allclose
from functrain.tree import batch_shape as tree_batch_shape
from functrain.tree import bias_correction as tree_bias_correction
from functrain.tree import cast as tree_cast
from functrain.tree import cast_like as tree_cast_like
from functrain.tree import clip as tree_clip
from functrain.tree import conj as tree_conj
from functrain.tree import div as tree_div
from functrain.tree import dtype as tree_dtype
from functrain.tree import full_like as tree_full_like
from functrain.tree import get as tree_get
from functrain.tree import get_all_with_path as tree_get_all_with_path
from functrain.tree import map_params as tree_map_params
from functrain.tree import max as tree_max
from functrain.tree import min as tree_min
from functrain.tree import mul as tree_mul
from functrain.tree import norm as tree_norm
from functrain.tree import ones_like as tree_ones_like
from functrain.tree import random_like as tree_random_like
from functrain.tree import real as tree_real
from functrain.tree import scale as tree_scale
from functrain.tree import set as tree_set
from functrain.tree import size as tree_size
from functrain.tree import split_key_like as tree_split_key_like
from functrain.tree import sub as tree_sub
from functrain.tree import sum as tree_sum
from functrain.tree import unwrap_random_key_data as tree_unwrap_random_key_data
from functrain.tree import update_infinity_moment as tree_update_infinity_moment
from functrain.tree import update_moment as tree_update_moment
from functrain.tree import update_moment_per_elem_norm as tree_update_moment_per_elem_norm
from functrain.tree import vdot as tree_vdot
from functrain.tree import where as tree_where
from functrain.tree import zeros_like as tree_zeros_like

__all__ = [
    "NamedTupleKey", "tree_add", "tree_add_scale", "tree_allclose", "tree_batch_shape",
    "tree_bias_correction", "tree_cast", "tree_cast_like", "tree_clip", "tree_conj",
    "tree_div", "tree_dtype", "tree_full_like", "tree_get", "tree_get_all_with_path",
    "tree_map_params", "tree_max", "tree_min", "tree_mul", "tree_norm", "tree_ones_like",
    "tree_random_like", "tree_real", "tree_scale", "tree_set", "tree_size",
    "tree_split_key_like", "tree_sub", "tree_sum", "tree_unwrap_random_key_data",
    "tree_update_infinity_moment", "tree_update_moment", "tree_update_moment_per_elem_norm",
    "tree_vdot", "tree_where", "tree_zeros_like",
]

# optax.tree_utils' deprecated names -> (the function, what to use instead).
_DEPRECATED = {
    "tree_scalar_mul": (tree_scale, "tree_scale"),
    "tree_add_scalar_mul": (tree_add_scale, "tree_add_scale"),
    "tree_l1_norm": (functools.partial(tree_norm, ord=1), "tree_norm(..., ord=1)"),
    "tree_l2_norm": (functools.partial(tree_norm, ord=2), "tree_norm"),
    "tree_linf_norm": (functools.partial(tree_norm, ord="inf"), "tree_norm(..., ord=jnp.inf)"),
}


def __getattr__(name: str) -> Any:
    """optax.tree_utils' deprecated names, with a ``DeprecationWarning`` naming the new one.

    Args:
      name: the attribute looked up.

    Returns:
      The function (``tree_l2_norm`` is ``tree_norm`` with ``ord=2``).

    >>> import warnings, jax.numpy as jnp
    >>> import functrain.tree_utils as otu
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter('ignore', DeprecationWarning)
    ...     otu.tree_l2_norm({'a': jnp.array([3., 4.])})
    Array(5., dtype=float32)
    """
    if name not in _DEPRECATED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    fn, instead = _DEPRECATED[name]
    warnings.warn(f"functrain.tree_utils.{name} is deprecated (as in optax.tree_utils): use "
                  f"functrain.tree_utils.{instead} or functrain.tree.", DeprecationWarning,
                  stacklevel=2)
    return fn
