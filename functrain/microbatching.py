"""Microbatching: evaluate a function on a large batch one slice at a time, and combine.

``microbatch`` turns ``fun(batch)`` into a sequential loop (``lax.fori_loop``)
over microbatches whose results are summed, averaged or concatenated;
``micro_vmap`` is ``jax.vmap`` run that way; ``micro_grad`` gives per-example
gradients (optionally transformed, e.g. clipped) combined over the batch. Peak
memory is that of one microbatch. optax's names, signatures and numbers
(``optax.microbatching``).

The batch axis of size ``B`` is split as ``(B // m, m)`` in column-major
order: microbatch ``k`` holds the examples ``k, k + B//m, k + 2 B//m, ...``,
so a sharding of the batch axis carries over to the ``m`` axis.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable, NamedTuple, Optional, Sequence, Union

import jax
import jax.numpy as jnp

from functrain import tree as ft

PyTree = Any
Function = Callable[..., Any]

__all__ = ["Accumulator", "AccumulationType", "IndividualOutputs", "microbatch", "micro_grad",
           "micro_vmap", "reshape_batch_axis"]


@dataclasses.dataclass(frozen=True)
class Accumulator:
    """How the per-microbatch values of a function are combined.

    For evaluations ``x_0, ..., x_{n-1}`` the result is
    ``finalize(update(...update(init(shape of x_0), x_0, 0)..., x_{n-1}, n-1))``;
    ``aggregate`` reduces a value with a leading batch axis in one go (used
    by :func:`micro_vmap` inside each microbatch).

    Attributes:
      init: ``init(shape_dtype_struct) -> carry``.
      update: ``update(carry, value, index) -> carry``.
      finalize: ``finalize(carry) -> result``.
      aggregate: ``aggregate(values_with_batch_axis) -> value``.

    >>> import jax.numpy as jnp
    >>> total = Accumulator(init=lambda s: jnp.zeros(s.shape, s.dtype),
    ...                     update=lambda c, v, i: c + v, finalize=lambda c: c,
    ...                     aggregate=lambda v: v.sum(0))
    >>> microbatch(jnp.sum, 0, 2, total)(jnp.arange(6.))
    Array(15., dtype=float32)
    """

    init: Callable[[Any], Any]
    update: Callable[[Any, Any, Any], Any]
    finalize: Callable[[Any], Any]
    aggregate: Callable[[Any], Any]


class AccumulationType(enum.Enum):
    """The built-in ways to combine microbatch results.

    ``SUM`` adds them; ``MEAN`` averages them over the number of microbatches;
    ``RUNNING_MEAN`` averages over the microbatches actually run (see
    ``num_real_microbatches``); ``CONCAT`` concatenates them along axis 0 in
    the original batch order. ``MEAN`` and ``RUNNING_MEAN`` need floating
    values.

    >>> import jax.numpy as jnp
    >>> microbatch(jnp.sum, 0, 2, AccumulationType.MEAN)(jnp.arange(6.))
    Array(5., dtype=float32)
    """

    MEAN = enum.auto()
    SUM = enum.auto()
    RUNNING_MEAN = enum.auto()
    CONCAT = enum.auto()


class IndividualOutputs(NamedTuple):
    """The second output of a :func:`micro_grad` function: per-example values.

    Attributes:
      values: the function's value for each example.
      metrics: ``metrics_fn`` of each example's gradient.
      aux: the function's auxiliary output for each example (``has_aux``).

    >>> IndividualOutputs(values=1.0, metrics=None, aux=None).values
    1.0
    """

    values: Any
    metrics: Any
    aux: Any


def reshape_batch_axis(tree: PyTree, microbatch_size: int, axis: int = 0) -> PyTree:
    """Every leaf's batch axis ``axis`` split into ``(num_microbatches, microbatch_size)``.

    The split is column-major: entry ``b`` of the batch goes to microbatch
    ``b % num_microbatches``, position ``b // num_microbatches``.

    Args:
      tree: a tree of arrays sharing a batch axis.
      microbatch_size: the size of each microbatch.
      axis: the batch axis.

    Returns:
      The reshaped tree.

    Beyond optax: a batch axis split over explicit mesh axes (``jax.make_mesh``'s
    default) works, where a plain reshape asks for an output sharding. The split
    stays on the ``microbatch_size`` axis, which must then be a multiple of the
    number of shards; each microbatch is spread over the devices as the batch was.

    >>> import jax.numpy as jnp
    >>> reshape_batch_axis(jnp.arange(6), 2)
    Array([[0, 3],
           [1, 4],
           [2, 5]], dtype=int32)
    """
    def leaf(x: jax.Array) -> jax.Array:
        spec = ft.explicit_spec(x)
        if spec is None or spec[axis] is None:
            shape = (*x.shape[:axis], -1, microbatch_size, *x.shape[axis + 1:])
            return jnp.reshape(x, shape, order="F")
        # Column-major split = a row-major split into (microbatch_size, n), then a swap of
        # the two: entry b = j * n + i goes to [i, j] either way. The row-major split keeps
        # each device's contiguous block of the batch in a block of microbatch_size.
        rows = (*x.shape[:axis], microbatch_size, -1, *x.shape[axis + 1:])
        split = jax.sharding.PartitionSpec(*spec[:axis], spec[axis], None, *spec[axis + 1:])
        return jnp.swapaxes(jnp.reshape(x, rows, out_sharding=split), axis, axis + 1)

    return jax.tree_util.tree_map(leaf, tree)


# --------------------------------------------------------------------------
# Accumulators
# --------------------------------------------------------------------------

def _floating_only(init: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def checked(value: Any) -> Any:
        if not jnp.issubdtype(value.dtype, jnp.floating):
            raise ValueError("MEAN and RUNNING_MEAN Accumulators require floating-point values.")
        return init(value)
    return checked


def _zeros(value: Any) -> jax.Array:
    return jnp.zeros(value.shape, value.dtype)


def _leafwise(acc: Accumulator) -> Accumulator:
    """An array accumulator applied to every leaf of a (sub)tree of outputs."""
    tm = jax.tree_util.tree_map
    return Accumulator(
        init=lambda v: tm(acc.init, v),
        update=lambda c, v, i: tm(lambda cc, vv: acc.update(cc, vv, i), c, v),
        finalize=lambda c: tm(acc.finalize, c),
        aggregate=lambda v: tm(acc.aggregate, v))


def _builtin(kind: AccumulationType, n: Optional[int]) -> Accumulator:
    if kind in (AccumulationType.MEAN, AccumulationType.CONCAT) and n is not None and n <= 0:
        raise ValueError(f"num_microbatches={n} must be positive.")
    if kind is AccumulationType.SUM:
        acc = Accumulator(_zeros, lambda c, v, i: c + v, lambda c: c,
                          lambda v: jnp.sum(v, axis=0))
    elif kind is AccumulationType.MEAN:
        acc = Accumulator(_floating_only(_zeros), lambda c, v, i: c + v, lambda c: c / n,
                          lambda v: jnp.mean(v, axis=0))
    elif kind is AccumulationType.RUNNING_MEAN:
        def running(c: Any, v: Any, i: Any) -> Any:
            w = i / (i + 1)  # the weight of the mean so far
            return c * w + v * (1 - w)
        acc = Accumulator(_floating_only(_zeros), running, lambda c: c,
                          lambda v: jnp.mean(v, axis=0))
    elif kind is AccumulationType.CONCAT:
        acc = Accumulator(
            init=lambda v: jnp.zeros((n, *v.shape), v.dtype),
            update=lambda c, v, i: c.at[i].set(v),
            finalize=lambda c: jnp.reshape(c, (-1, *c.shape[2:]), order="F"),
            aggregate=lambda v: v)
    else:
        raise ValueError(f"Unknown accumulator: {kind}")
    return _leafwise(acc)


def _resolve(spec: Any, n: Optional[int]) -> Accumulator:
    """One accumulator for a whole output tree, from a prefix tree of accumulator specs."""
    def one(item: Any) -> Accumulator:
        if isinstance(item, Accumulator):
            return item
        if isinstance(item, AccumulationType):
            return _builtin(item, n)
        raise ValueError(f"Unknown accumulator: {item}")

    accs = jax.tree_util.tree_map(one, spec)
    tm = jax.tree_util.tree_map
    return Accumulator(
        init=lambda v: tm(lambda a, x: a.init(x), accs, v),
        update=lambda c, v, i: tm(lambda a, cc, x: a.update(cc, x, i), accs, c, v),
        finalize=lambda c: tm(lambda a, cc: a.finalize(cc), accs, c),
        aggregate=lambda v: tm(lambda a, x: a.aggregate(x), accs, v))


# --------------------------------------------------------------------------
# The transformations
# --------------------------------------------------------------------------

def microbatch(fun: Function, argnums: Union[int, Sequence[int]],
               microbatch_size: Optional[int],
               accumulator: Any = AccumulationType.SUM, *,
               argnames: Union[str, Sequence[str]] = (),
               in_axes: Union[int, Sequence[int]] = 0,
               num_real_microbatches: Optional[Any] = None) -> Function:
    """``fun`` evaluated one microbatch at a time in a ``lax.fori_loop``, results combined.

    Args:
      fun: any function.
      argnums: the positional arguments with a batch axis.
      microbatch_size: the rows per microbatch (must divide the batch size);
        ``None`` returns ``fun`` itself.
      accumulator: how results combine: an :class:`Accumulator`, an
        :class:`AccumulationType`, or a tree of them that is a prefix of
        ``fun``'s output.
      argnames: the keyword arguments with a batch axis.
      in_axes: the batch axis of each of ``argnums + argnames`` (an int for all).
      num_real_microbatches: stop after this many microbatches (may be traced).

    Returns:
      A function with ``fun``'s arguments returning the combined result.

    Raises:
      ValueError: (when called) batch axes of different sizes, a batch size
        that ``microbatch_size`` does not divide, or MEAN/RUNNING_MEAN of
        non-floating values.

    >>> import jax.numpy as jnp
    >>> f = lambda x, y: (x * y, jnp.sum(x * y))
    >>> acc = (AccumulationType.CONCAT, AccumulationType.SUM)
    >>> microbatch(f, (0, 1), 2, acc)(jnp.arange(4), jnp.arange(4) + 2)
    (Array([ 0,  3,  8, 15], dtype=int32), Array(26, dtype=int32))
    """
    if microbatch_size is None:
        return fun
    argnums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    argnames = (argnames,) if isinstance(argnames, str) else tuple(argnames)
    if isinstance(in_axes, int):
        in_axes = (in_axes,) * (len(argnums) + len(argnames))
    in_axes = tuple(in_axes)
    pos_axes, name_axes = in_axes[:len(argnums)], in_axes[len(argnums):]

    def run(*args: Any, **kwargs: Any) -> Any:
        batched = [args[i] for i in argnums] + [kwargs[k] for k in argnames]
        sizes = [x.shape[ax] for ax, sub in zip(in_axes, batched)
                 for x in jax.tree_util.tree_leaves(sub)]
        if len(set(sizes)) > 1:
            raise ValueError(f"Batch Arguments must have equal-size batch axes, found {sizes}.")
        batch_size = sizes[0]
        if batch_size % microbatch_size:
            raise ValueError(f"batch_size={batch_size} must be divisible by "
                             f"microbatch_size={microbatch_size}.")
        args, kwargs = list(args), dict(kwargs)
        for i, ax in zip(argnums, pos_axes):
            args[i] = reshape_batch_axis(args[i], microbatch_size, ax)
        for k, ax in zip(argnames, name_axes):
            kwargs[k] = reshape_batch_axis(kwargs[k], microbatch_size, ax)
        acc = _resolve(accumulator, batch_size // microbatch_size)

        def slice_k(k: Any) -> Any:
            a, kw = list(args), dict(kwargs)
            for i, ax in zip(argnums, pos_axes):
                a[i] = jax.tree_util.tree_map(lambda x: jnp.take(x, k, axis=ax), a[i])
            for name, ax in zip(argnames, name_axes):
                kw[name] = jax.tree_util.tree_map(lambda x: jnp.take(x, k, axis=ax), kw[name])
            return fun(*a, **kw)

        steps = (batch_size // microbatch_size if num_real_microbatches is None
                 else num_real_microbatches)
        carry = jax.lax.fori_loop(0, steps, lambda k, c: acc.update(c, slice_k(k), k),
                                  acc.init(jax.eval_shape(slice_k, 0)))
        return acc.finalize(carry)

    return run


def micro_vmap(fun: Function, in_axes: Union[int, Sequence[Optional[int]]] = 0,
               out_axes: Any = 0, *, microbatch_size: Optional[int] = None,
               vmap_fn: Callable[..., Any] = jax.vmap,
               accumulator: Any = AccumulationType.CONCAT,
               num_real_microbatches: Optional[Any] = None) -> Function:
    """``jax.vmap(fun)`` run one microbatch at a time; the outputs may also be reduced.

    Keyword arguments of the returned function are mapped over axis 0.

    Args:
      fun: the function to map.
      in_axes: the mapped axis of each positional argument (``None``: not mapped).
      out_axes: must be 0.
      microbatch_size: the rows per microbatch; ``None``: one vmap over the whole batch.
      vmap_fn: a function like ``jax.vmap`` (to pass options to it).
      accumulator: ``CONCAT`` (as vmap) or a reduction over the batch
        (``SUM``, ``MEAN``, ...), or a prefix tree of them.
      num_real_microbatches: stop after this many microbatches.

    Returns:
      The mapped function.

    Raises:
      NotImplementedError: ``out_axes`` is not 0.

    >>> import jax.numpy as jnp
    >>> micro_vmap(lambda x: x ** 2, microbatch_size=2)(jnp.arange(6))
    Array([ 0,  1,  4,  9, 16, 25], dtype=int32)
    """
    if out_axes != 0:
        raise NotImplementedError("out_axis != 0 is not currently supported")
    in_axes = (in_axes,) if isinstance(in_axes, int) else tuple(in_axes)

    def mapped_and_reduced(*args: Any, kwargs: dict) -> Any:
        out = vmap_fn(fun, in_axes, out_axes)(*args, **kwargs)
        # Only `aggregate` is used, which needs no microbatch count.
        return _resolve(accumulator, jax.tree_util.tree_leaves(out)[0].shape[0]).aggregate(out)

    looped = microbatch(
        mapped_and_reduced,
        argnums=tuple(i for i, ax in enumerate(in_axes) if ax is not None),
        argnames="kwargs", microbatch_size=microbatch_size, accumulator=accumulator,
        in_axes=tuple(ax for ax in in_axes if ax is not None) + (0,),
        num_real_microbatches=num_real_microbatches)
    return lambda *args, **kwargs: looped(*args, kwargs=kwargs)


def micro_grad(fun: Function, has_aux: bool = False, argnums: Union[int, Sequence[int]] = 0,
               *, batch_argnums: Union[int, Sequence[int]] = 1, keep_batch_dim: bool = True,
               microbatch_size: Optional[int] = None,
               accumulator: Any = AccumulationType.SUM,
               transform_fn: Callable[[Any], Any] = lambda x: x,
               metrics_fn: Callable[[Any], Any] = lambda x: None,
               num_real_microbatches: Optional[Any] = None) -> Function:
    """Per-example gradients, transformed (e.g. clipped) and combined over the batch.

    Each example's ``grad`` of ``fun`` goes through ``transform_fn`` and is
    combined by ``accumulator`` (summed by default); the values, ``metrics_fn``
    of each raw gradient and the aux output are returned per example.

    Args:
      fun: ``fun(params, batch, ...)`` returning a scalar (and aux with ``has_aux``).
      has_aux: ``fun`` returns ``(value, aux)``.
      argnums: the argument(s) to differentiate.
      batch_argnums: the argument(s) with a batch axis 0.
      keep_batch_dim: ``fun`` sees each example with a batch axis of size 1.
      microbatch_size: examples per microbatch; ``None``: all at once.
      accumulator: how the transformed gradients combine.
      transform_fn: applied to each example's gradient.
      metrics_fn: applied to each example's gradient, returned per example.
      num_real_microbatches: stop after this many microbatches.

    Returns:
      A function returning ``(combined_gradient, IndividualOutputs(values,
      metrics, aux))``.

    >>> import jax.numpy as jnp
    >>> loss = lambda w, x: jnp.sum((w * x) ** 2)
    >>> g, out = micro_grad(loss, microbatch_size=2)(jnp.ones(1), jnp.arange(4.)[:, None])
    >>> g, out.values
    (Array([28.], dtype=float32), Array([0., 1., 4., 9.], dtype=float32))
    """
    batch_argnums = (batch_argnums,) if isinstance(batch_argnums, int) else tuple(batch_argnums)
    with_aux = fun if has_aux else (lambda *a, **k: (fun(*a, **k), None))
    value_and_grad = jax.value_and_grad(with_aux, argnums, has_aux=True)

    def per_example(*args: Any, **kwargs: Any) -> tuple:
        (value, aux), grad = value_and_grad(*args, **kwargs)
        return transform_fn(grad), IndividualOutputs(values=value, metrics=metrics_fn(grad),
                                                     aux=aux)

    in_axes = [None] * (max(batch_argnums) + 1)
    for i in batch_argnums:
        in_axes[i] = 0
    mapped = micro_vmap(per_example, in_axes=in_axes,
                        accumulator=(accumulator, AccumulationType.CONCAT),
                        microbatch_size=microbatch_size,
                        num_real_microbatches=num_real_microbatches)
    if not keep_batch_dim:
        return mapped

    def with_unit_axis(*args: Any, **kwargs: Any) -> Any:
        args = list(args)
        for i in batch_argnums:
            args[i] = jax.tree_util.tree_map(lambda x: jnp.expand_dims(x, 1), args[i])
        return mapped(*args, **kwargs)

    return with_unit_axis
