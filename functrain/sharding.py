"""Shardings for optimizer state: follow the parameters, or split it (ZeRO-1).

functrain builds no distribution of its own; it runs on JAX's. What it
guarantees is where the optimizer state lives:

* ``opt.init(params)``, eager or under ``jax.jit``, returns state whose
  params-shaped buffers carry the sharding of the corresponding parameter
  (the tree engine creates them with :func:`functrain.tree.zeros_like`, which
  places eager zeros on the param's sharding and, under a trace, ties them to
  the param with ``shard_alike``). Scalars such as step counts are replicated.
* The update is elementwise per leaf plus whole-leaf reductions (norms), so
  XLA keeps each buffer's sharding from step to step without resharding.

This module builds sharding trees for the state without allocating it:

* :func:`state_shardings` -- the shardings ``opt.init(params)`` produces, for
  ``jax.jit`` in/out shardings and for restoring checkpoints;
* :func:`zero_shardings` -- ZeRO stage 1: every params-shaped buffer split
  along the data axis, so each device keeps ``1/N`` of the moments;
* :func:`abstract_state` -- ``jax.ShapeDtypeStruct`` state with shardings
  attached, a restore target;
* :func:`per_device_bytes` -- how many bytes of a tree each device holds.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, Sharding, SingleDeviceSharding

from functrain import tree as ft

PyTree = Any

__all__ = ["state_shardings", "zero_shardings", "abstract_state", "per_device_bytes"]


def _is_array(x: Any) -> bool:
    """An array-like leaf: a shape and a dtype, and no pytree children (``QuantizedArray``
    has a shape and a dtype too, but is a node holding codes and scales)."""
    return (hasattr(x, "shape") and hasattr(x, "dtype")
            and jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(x)))


def _default_sharding() -> Sharding:
    return SingleDeviceSharding(jax.devices()[0])


def _replicated_like(shardings: list[Optional[Sharding]]) -> Sharding:
    """A replicated sharding on the devices the params live on."""
    for s in shardings:
        if isinstance(s, NamedSharding):
            return NamedSharding(s.mesh, PartitionSpec())
    for s in shardings:
        if s is not None and s.is_fully_replicated:
            return s
    return _default_sharding()


def state_shardings(opt: Any, params: PyTree) -> PyTree:
    """The sharding tree of ``opt.init(params)``, derived without allocating.

    ``params`` may hold arrays or ``jax.ShapeDtypeStruct`` leaves (with their
    ``sharding`` set, e.g. the params' target layout). In every subtree of the
    state laid out like the params (``mu``, ``nu``, momentum traces,
    accumulated gradients, ...), a buffer with its parameter's shape gets that
    parameter's sharding; every other buffer (step counts, scalar
    hyperparameters, factored statistics of another shape) is replicated over
    the params' mesh. Parameters without a sharding mean the default device.
    For params-shaped buffers and scalars this is what
    ``jax.jit(opt.init)(params)`` returns; the tree is usable as
    ``in_shardings`` / ``out_shardings`` of a train step (which also pins the
    layout of odd-shaped buffers that jit would leave to XLA) or as a
    checkpoint restore target.

    Args:
      opt: a ``GradientTransformation`` (anything with ``init``).
      params: the parameters, concrete or abstract.

    Returns:
      A tree with the structure of ``opt.init(params)`` holding ``Sharding``
      objects (masked-out leaves keep their ``MaskedNode`` placeholders).

    >>> import jax, jax.numpy as jnp, functrain
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> mesh = jax.make_mesh((1,), ('model',))
    >>> params = {'w': jax.ShapeDtypeStruct((4, 2), jnp.float32,
    ...                                     sharding=NamedSharding(mesh, P(None, 'model')))}
    >>> shardings = state_shardings(functrain.adam(1e-3), params)
    >>> tuple(shardings[0].mu['w'].spec), tuple(shardings[0].count.spec)
    ((None, 'model'), ())
    """
    abstract = jax.eval_shape(opt.init, params)
    _, p_leaves, treedef = ft.flatten_with_paths(params)
    p_shardings = [getattr(x, "sharding", None) for x in p_leaves]
    replicated = _replicated_like(p_shardings)
    p_shardings = [s if s is not None else _default_sharding() for s in p_shardings]

    def match(sub: Any) -> Optional[PyTree]:
        try:
            entries = treedef.flatten_up_to(sub)
        except (ValueError, TypeError):
            return None
        out = []
        for e, p, s in zip(entries, p_leaves, p_shardings):
            if ft.is_placeholder(e):
                out.append(e)
            elif _is_array(e):  # a buffer of another shape (e.g. factored statistics):
                out.append(s if tuple(e.shape) == tuple(np.shape(p)) else replicated)
            else:  # a node per parameter (quantized state: codes and scales), leaf by leaf
                parts, node = jax.tree_util.tree_flatten(e)
                if not parts or not all(_is_array(x) for x in parts):
                    return None
                out.append(node.unflatten([s if tuple(x.shape) == tuple(np.shape(p))
                                           else replicated for x in parts]))
        return treedef.unflatten(out)

    def assign(sub: Any) -> PyTree:
        matched = match(sub)
        if matched is not None:
            return matched
        if _is_array(sub):
            return replicated
        children, node = jax.tree_util.tree_flatten(sub, is_leaf=lambda x: x is not sub)
        if node.num_leaves == 1 and node.num_nodes == 1:  # a non-array leaf
            return replicated
        return node.unflatten([assign(c) for c in children])

    return assign(abstract)


def abstract_state(opt: Any, params: PyTree, shardings: Optional[PyTree] = None) -> PyTree:
    """``opt.init(params)`` as ``jax.ShapeDtypeStruct`` leaves with shardings attached.

    A restore target for checkpoints (load the state straight into its sharded
    layout) and the input of :func:`zero_shardings` before any state exists.
    ``shardings`` defaults to :func:`state_shardings`; pass e.g. the result of
    :func:`zero_shardings` to describe a ZeRO-1 layout instead.

    Args:
      opt: a ``GradientTransformation`` (anything with ``init``).
      params: the parameters, concrete or abstract (``jax.ShapeDtypeStruct``
        leaves).
      shardings: a tree of ``Sharding`` with the structure of the state, or
        ``None`` for :func:`state_shardings` ``(opt, params)``; a tree of
        another structure is a ``ValueError``.

    Returns:
      A tree with the structure of ``opt.init(params)`` whose leaves are
      ``jax.ShapeDtypeStruct`` (shape, dtype and sharding of each buffer);
      nothing is allocated.

    >>> import jax.numpy as jnp, functrain
    >>> abstract_state(functrain.sgd(0.1, momentum=0.9), {'w': jnp.zeros(3)})[0].trace['w']
    ShapeDtypeStruct(shape=(3,), dtype=float32, sharding=SingleDeviceSharding(...))
    """
    abstract = jax.eval_shape(opt.init, params)
    if shardings is None:
        shardings = state_shardings(opt, params)
    ft.check_structure(abstract, shardings, "shardings", "the optimizer state")
    return jax.tree_util.tree_map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


def _spec_axes(entry: Any) -> tuple:
    if entry is None:
        return ()
    if isinstance(entry, tuple):
        return entry
    return (entry,)


def _base_spec(path: str, x: Any, mesh: Any) -> list:
    """The leaf's current partition spec on ``mesh``, padded to its rank."""
    ndim = len(np.shape(x))
    sharding = getattr(x, "sharding", None)
    if isinstance(sharding, NamedSharding):
        spec = list(sharding.spec) + [None] * (ndim - len(sharding.spec))
        for entry in spec:
            for name in _spec_axes(entry):
                if name not in mesh.shape or mesh.shape[name] != sharding.mesh.shape[name]:
                    raise ValueError(
                        f"state leaf {path or '<root>'} is sharded over mesh axis {name!r} "
                        f"({dict(sharding.mesh.shape)}), which the given mesh "
                        f"{dict(mesh.shape)} does not have with that size: pass the mesh "
                        f"the parameters live on.")
        return spec
    if sharding is None or sharding.is_fully_replicated:
        return [None] * ndim
    raise ValueError(f"state leaf {path or '<root>'} has a {type(sharding).__name__}, which "
                     f"zero_shardings cannot read: place the state with NamedSharding.")


def zero_shardings(state: PyTree, mesh: Any, axis: str = "data", *,
                   min_size: int = 0) -> PyTree:
    """ZeRO-1 shardings for ``state``: every buffer split along ``axis`` where it can be.

    For each array in ``state`` (concrete, or ``jax.ShapeDtypeStruct`` from
    ``jax.eval_shape`` / :func:`abstract_state`), keep its current sharding
    and additionally split its first dimension that is not sharded yet and is
    divisible by the size of ``axis``. Buffers that already use ``axis``,
    scalars, buffers with no divisible free dimension, and buffers with fewer
    than ``min_size`` elements stay as they are (replicated over ``axis``).
    With data-parallel training (params replicated over ``axis``) each device
    then keeps ``1/N`` of the moments: the update computes each slice locally
    from the all-reduced gradients and only the new parameters are gathered.

    The result is a tree of ``NamedSharding`` with the structure of ``state``:
    use it in ``jax.device_put(state, shardings)`` and as the state's entry of
    a train step's ``in_shardings`` / ``out_shardings``.

    Args:
      state: an optimizer state (or its abstract version).
      mesh: the ``jax.sharding.Mesh`` the parameters live on.
      axis: the mesh axis to split over (the data-parallel axis).
      min_size: buffers with fewer elements than this stay replicated; the
        default 0 splits every buffer that can be split.

    Returns:
      A tree of ``NamedSharding`` on ``mesh`` with the structure of ``state``.

    Raises:
      ValueError: if ``axis`` is not an axis of ``mesh``, a leaf is sharded
        over a mesh axis that ``mesh`` lacks (or has with another size), or a
        leaf has a partial sharding that is not a ``NamedSharding``.
      TypeError: if a leaf of ``state`` is not an array.

    >>> import jax, jax.numpy as jnp, functrain
    >>> mesh = jax.make_mesh((1,), ('data',))
    >>> opt = functrain.adam(1e-3)
    >>> state = jax.eval_shape(opt.init, {'w': jnp.zeros((6, 4)), 'b': jnp.zeros(3)})
    >>> shardings = zero_shardings(state, mesh)
    >>> tuple(shardings[0].mu['w'].spec), tuple(shardings[0].count.spec)
    (('data', None), ())
    >>> state = jax.device_put(opt.init({'w': jnp.zeros((6, 4)), 'b': jnp.zeros(3)}), shardings)
    """
    if axis not in mesh.shape:
        raise ValueError(f"zero_shardings: mesh axis {axis!r} is not in the mesh "
                         f"{dict(mesh.shape)}; pass axis= the data-parallel axis name.")
    size = mesh.shape[axis]
    paths, leaves, treedef = ft.flatten_with_paths(state)
    out = []
    for path, x in zip(paths, leaves):
        if not _is_array(x) and not isinstance(x, (int, float, complex, bool, np.generic)):
            raise TypeError(f"zero_shardings: state leaf {path or '<root>'} is a "
                            f"{type(x).__name__}, not an array.")
        shape = np.shape(x)
        spec = _base_spec(path, x, mesh)
        used = {name for entry in spec for name in _spec_axes(entry)}
        if axis not in used and int(np.prod(shape, dtype=np.int64)) >= max(min_size, 1):
            for d, n in enumerate(shape):
                if spec[d] is None and n > 0 and n % size == 0:
                    spec[d] = axis
                    break
        out.append(NamedSharding(mesh, PartitionSpec(*spec)))
    return treedef.unflatten(out)


def per_device_bytes(tree: PyTree) -> dict:
    """Bytes of the arrays in ``tree`` held on each (addressable) device.

    A buffer replicated on ``N`` devices counts on all ``N``; a sharded one
    counts only its shard on each device. Non-``jax.Array`` leaves are ignored.

    Args:
      tree: any pytree (e.g. params or an optimizer state).

    Returns:
      A dict from each ``jax.Device`` holding part of ``tree`` to the number
      of bytes it holds (empty if ``tree`` has no ``jax.Array``).

    >>> import jax, jax.numpy as jnp
    >>> list(per_device_bytes({'w': jnp.zeros((4, 2)), 'b': jnp.zeros(2)}).values())
    [40]
    """
    totals: dict = {}
    for x in jax.tree_util.tree_leaves(tree):
        if not isinstance(x, jax.Array):
            continue
        for shard in x.addressable_shards:
            totals[shard.device] = totals.get(shard.device, 0) + shard.data.nbytes
    return totals
