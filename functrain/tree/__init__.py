"""Public pytree math, ``functrain.tree``: every function of ``optax.tree``, and the ones
functrain uses itself. Users import this package; its ``__init__`` only re-exports, from
five modules:

* from :mod:`functrain.tree.basics`: ``map``, ``leaves``, ``add_scaled``, ``leaf_norm`` (of
  one array), ``zeros_like`` / ``ones_like`` / ``full_like``, the casts and dtypes (``cast``,
  ``cast_like``, ``dtype``, and the dtype policy ``compute_dtype``), the random trees
  (``random_like``, ``split_key_like``, ``unwrap_random_key_data``), sub-trees by path
  (``get_path`` / ``set_path``), ``is_single_leaf``, ``map_broadcast`` for Ivy-style
  arguments that may or may not be trees, ``distinct_buffers`` and ``explicit_spec``;
* from :mod:`functrain.tree.ops`: optax.tree's arithmetic and reductions (``add``,
  ``scale``, ``vdot``, ``norm``, ...) and ``sum_of_squares`` of one array;
* from :mod:`functrain.tree.moments`: optax.tree's moments (``update_moment``,
  ``bias_correction``, ...);
* from :mod:`functrain.tree.state`: optax.tree's state helpers (``get``, ``set``,
  ``get_all_with_path``, ``map_params``, ``NamedTupleKey``);
* from :mod:`functrain.tree.checks`: the key-path checks (``check_structure``,
  ``check_shapes``, ``key_paths``) and masks (``MaskedNode``, ``is_placeholder``).

optax's older ``optax.tree_utils`` names (``tree_add``, ...) are aliases of these in
:mod:`functrain.tree_utils`.
"""

# Re-exports only.
from functrain.tree.basics import (map, add_scaled, leaf_norm, zeros_like, ones_like,
                                   full_like, leaves, compute_dtype, cast, cast_like, dtype,
                                   split_key_like, random_like, unwrap_random_key_data,
                                   is_single_leaf, get_path, set_path, map_broadcast,
                                   distinct_buffers, explicit_spec)
from functrain.tree.checks import (MaskedNode, check_leaf_dtypes, check_shapes,
                                   check_structure, flatten_like, flatten_with_paths,
                                   format_paths, is_mask_function, is_params_placeholder,
                                   is_placeholder, key_paths, resolve_leaf_mask, resolve_mask)
from functrain.tree.state import (NamedTupleKey, get, get_all_with_path, is_named_tuple,
                                  map_params, set)
from functrain.tree.ops import (add, add_scale, allclose, batch_shape, clip, conj, div, max,
                                min, mul, norm, real, scale, size, sub, sum, sum_of_squares,
                                vdot, where)
from functrain.tree.moments import (bias_correction, update_infinity_moment, update_moment,
                                    update_moment_per_elem_norm)


__all__ = [
    "add", "sub", "mul", "scale", "add_scaled", "vdot", "sum", "norm", "leaf_norm",
    "zeros_like", "ones_like", "full_like", "cast", "where", "map", "leaves",
    "key_paths", "check_structure", "check_shapes", "MaskedNode", "is_placeholder",
    "sum_of_squares", "get_path", "set_path", "is_single_leaf", "map_broadcast",
    # the rest of optax.tree
    "add_scale", "allclose", "batch_shape", "bias_correction", "cast_like", "clip", "conj",
    "div", "dtype", "get", "get_all_with_path", "map_params", "max", "min", "random_like",
    "real", "set", "size", "split_key_like", "unwrap_random_key_data",
    "update_infinity_moment", "update_moment", "update_moment_per_elem_norm",
    "NamedTupleKey", "distinct_buffers", "explicit_spec",
]
