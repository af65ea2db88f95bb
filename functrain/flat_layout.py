"""Params, gradients and optimizer state held as one flat buffer per dtype between steps.

A tree of many small leaves costs one kernel per leaf on an accelerator: XLA compiles an
element-wise step leaf by leaf (the H100 program of AdamW on 1000 leaves launches 1,002
kernels, optax's and functrain's alike; the GPU compiler no longer has a horizontal fusion
pass, and gathering the leaves into one buffer inside the step costs a copy in and out of
it). The remedy PyTorch's fused and foreach AdamW apply at run time is a layout: the
params live in a few flat buffers between steps, the model reads its leaves as slices of
them, and the gradient arrives flat. :func:`flat_layout` describes that layout (one
1-D buffer per dtype, or per group and dtype), :meth:`FlatLayout.flatten` and
:meth:`FlatLayout.unflatten` convert (``unflatten`` inside the loss is differentiable, so
``jax.grad`` of the loss with respect to the flat buffers gives flat gradients), and
:func:`on_flat_layout` runs an optimizer on the buffers: a few kernels per step whatever
the number of leaves, at the element-wise floor of bytes.

The numbers are the tree's only for optimizers whose step is per element, with whole-tree
reductions at most (sgd, adam, adamw, lion, rmsprop, ..., chained with
``clip_by_global_norm``, whose sum is then taken in another order). Per-leaf norms (lamb,
lars, ``clip_by_block_rms``), factored or matrix state (adafactor, muon, soap) and masks
written for the tree would change: :func:`on_flat_layout` runs the optimizer both ways on
random data of the layout's shapes when it is built and refuses one whose updates differ,
naming the leaves. Masks and labels go through :meth:`FlatLayout.per_buffer`, with the layout
grouped so that each buffer holds leaves of one mask value.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from functrain.arg_checks import check_transformation
from functrain.engine.protocol import (GradientTransformation, OptState, Params, Updates,
                                       call_update)
from functrain.param_updates import apply_updates
from functrain.tree.checks import flatten_with_paths, format_paths

__all__ = ["FlatLayout", "flat_layout", "on_flat_layout"]

PyTree = Any


@dataclasses.dataclass(frozen=True, eq=False)
class FlatLayout:
    """Where each leaf of a tree lives in a few flat buffers (built by :func:`flat_layout`).

    Attributes:
      treedef: the tree's structure.
      paths: each leaf's key path, as a string.
      shapes: each leaf's shape.
      dtypes: each leaf's dtype.
      keys: the buffer each leaf lives in (its dtype's name, or ``"group/dtype"``).
      offsets: where each leaf starts in its buffer.
      buffers: buffer key -> ``jax.ShapeDtypeStruct`` of the 1-D buffer.

    >>> import jax.numpy as jnp, functrain
    >>> layout = functrain.flat_layout({'b': jnp.zeros(2), 'w': jnp.ones((2, 2))})
    >>> flat = layout.flatten({'b': jnp.zeros(2), 'w': jnp.ones((2, 2))})
    >>> flat['float32'].tolist()
    [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    >>> layout.unflatten(flat)['w'].shape
    (2, 2)
    """

    treedef: Any
    paths: tuple
    shapes: tuple
    dtypes: tuple
    keys: tuple
    offsets: tuple
    buffers: dict

    def abstract(self) -> PyTree:
        """The tree the layout holds, as ``jax.ShapeDtypeStruct`` leaves.

        Returns:
          A tree of the layout's structure.
        """
        return self.treedef.unflatten([jax.ShapeDtypeStruct(s, d)
                                       for s, d in zip(self.shapes, self.dtypes)])

    def flatten(self, tree: PyTree) -> dict:
        """The tree's leaves gathered into the layout's buffers.

        Args:
          tree: a tree of the layout's structure, shapes and dtypes (params, gradients, or
            any tree like them).

        Returns:
          ``{buffer key: 1-D array}``.
        """
        paths, leaves, treedef = flatten_with_paths(tree)
        if treedef != self.treedef:
            raise ValueError(f"flatten: the tree's structure differs from the layout's: "
                             f"{format_paths(sorted(set(paths) ^ set(self.paths)))} "
                             f"(layout: {len(self.paths)} leaves, tree: {len(paths)}).")
        for path, leaf, shape, dtype in zip(paths, leaves, self.shapes, self.dtypes):
            if np.shape(leaf) != shape or jnp.result_type(leaf) != dtype:
                raise ValueError(f"flatten: leaf {path} is {jnp.result_type(leaf)}"
                                 f"{list(np.shape(leaf))}, the layout's is "
                                 f"{jnp.dtype(dtype)}{list(shape)}.")
        return self._gather(leaves)

    def _gather(self, leaves: list) -> dict:
        """The leaves (in the layout's order, checked by the caller) raveled into buffers."""
        parts: dict = {key: [] for key in self.buffers}
        for leaf, key in zip(leaves, self.keys):
            parts[key].append(jnp.ravel(leaf))
        return {key: v[0] if len(v) == 1 else jnp.concatenate(v) for key, v in parts.items()}

    def unflatten(self, flat: dict) -> PyTree:
        """The tree whose leaves are slices of the buffers (differentiable).

        Args:
          flat: ``{buffer key: 1-D array}`` as :meth:`flatten` gives.

        Returns:
          The tree, each leaf in its shape.
        """
        self.check_flat(flat, "unflatten")
        return _unflatten(self, flat)

    def slices(self, flat: dict) -> PyTree:
        """:meth:`unflatten` without its gradient rule (for :func:`_unflatten`)."""
        leaves = [flat[key][start:start + int(np.prod(shape))].reshape(shape)
                  for key, start, shape in zip(self.keys, self.offsets, self.shapes)]
        return self.treedef.unflatten(leaves)

    def check_flat(self, flat: Any, what: str) -> None:
        """Raise ``ValueError`` unless ``flat`` holds exactly the layout's buffers.

        Args:
          flat: the value to check.
          what: what it is, for the message.

        Returns:
          ``None``.
        """
        if not isinstance(flat, dict) or set(flat) != set(self.buffers):
            got = sorted(flat) if isinstance(flat, dict) else type(flat).__name__
            raise ValueError(f"{what}: expected the layout's flat buffers "
                             f"{sorted(self.buffers)}, got {got}.")
        for key, want in self.buffers.items():
            x = flat[key]
            if np.shape(x) != want.shape or jnp.result_type(x) != want.dtype:
                raise ValueError(f"{what}: buffer {key!r} is {jnp.result_type(x)}"
                                 f"{list(np.shape(x))}, the layout's is "
                                 f"{want.dtype}{list(want.shape)}.")

    def _params_like(self, x: Any) -> bool:
        """Whether ``x`` has the layout's structure and leaf shapes (any dtype)."""
        leaves, treedef = jax.tree_util.tree_flatten(x)
        return treedef == self.treedef and all(
            hasattr(leaf, "shape") and tuple(leaf.shape) == shape
            for leaf, shape in zip(leaves, self.shapes))

    def _is_buffers(self, x: Any) -> bool:
        """Whether ``x`` is a dict of the layout's buffers (their shapes, any dtype)."""
        return isinstance(x, dict) and set(x) == set(self.buffers) and all(
            np.shape(x[key]) == want.shape for key, want in self.buffers.items())

    def state_to_flat(self, state: PyTree) -> PyTree:
        """An optimizer state made on the tree as the same optimizer's state on the buffers.

        Every subtree of ``state`` with the layout's structure and leaf shapes (moments in
        any dtype) is gathered into buffers; the rest (counts, scalars, masked-out
        placeholders) is kept. For moving a checkpoint made on the tree to
        :func:`on_flat_layout` (and back with :meth:`state_from_flat`).

        Args:
          state: the state ``opt.init(params)`` (or a later one) on the tree.

        Returns:
          The state ``on_flat_layout(opt, self)`` keeps.
        """
        return jax.tree_util.tree_map(
            lambda x: self._gather(jax.tree_util.tree_leaves(x)) if self._params_like(x) else x,
            state, is_leaf=self._params_like)

    def state_from_flat(self, state: PyTree) -> PyTree:
        """:meth:`state_to_flat` undone: every dict of the layout's buffers cut into the tree.

        Args:
          state: a state kept by ``on_flat_layout(opt, self)``.

        Returns:
          The same optimizer's state on the tree.
        """
        return jax.tree_util.tree_map(lambda x: self.slices(x) if self._is_buffers(x) else x,
                                      state, is_leaf=self._is_buffers)

    def per_buffer(self, fn: Callable[[PyTree], PyTree]) -> Callable[[PyTree], PyTree]:
        """A per-leaf function (a mask, partition labels) that also answers for the buffers.

        Args:
          fn: ``tree -> tree of values`` (for example ``lambda p: jax.tree.map(lambda x:
            x.ndim > 1, p)``), evaluated once on the layout's abstract tree.

        Returns:
          A function giving ``fn(tree)`` for a tree and ``{buffer key: value}`` for the flat
          buffers; raises ``ValueError`` now if a buffer holds leaves of different values
          (group the layout by them).
        """
        values = jax.tree.leaves(fn(self.abstract()))
        if len(values) != len(self.paths):
            raise ValueError(f"per_buffer: fn gave {len(values)} values for "
                             f"{len(self.paths)} leaves.")
        per_key: dict = {}
        for path, key, value in zip(self.paths, self.keys, values):
            per_key.setdefault(key, []).append((path, value))
        flat_values = {}
        for key, pairs in per_key.items():
            distinct = {v for _, v in pairs}
            if len(distinct) > 1:
                raise ValueError(
                    f"per_buffer: buffer {key!r} holds leaves of different values "
                    f"{sorted(map(repr, distinct))} (for example {pairs[0][0]} and "
                    f"{next(p for p, v in pairs if v != pairs[0][1])}); build the layout "
                    f"with group= so that each buffer holds one value.")
            flat_values[key] = pairs[0][1]

        def lifted(tree: PyTree) -> PyTree:
            if self._is_buffers(tree):
                return dict(flat_values)
            return fn(tree)

        return lifted


# The gradient of the slices is the cotangents gathered back into buffers: one concatenate.
# Left to JAX, each slice's transpose pads its cotangent to the whole buffer and the pads are
# summed, a buffer's worth of traffic per leaf (15 ms against 0.5 ms per training step of 40
# small leaves on CPU).
@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _unflatten(layout: FlatLayout, flat: dict) -> PyTree:
    return layout.slices(flat)


def _unflatten_fwd(layout: FlatLayout, flat: dict) -> tuple:
    return layout.slices(flat), None


def _unflatten_bwd(layout: FlatLayout, _: None, cotangent: PyTree) -> tuple:
    leaves = [jnp.zeros(s, d) if jax.dtypes.result_type(c) == jax.dtypes.float0 else c
              for c, s, d in zip(jax.tree.leaves(cotangent), layout.shapes, layout.dtypes)]
    flat = layout._gather(leaves)
    return ({key: x if jnp.issubdtype(x.dtype, jnp.inexact)
             else np.zeros(x.shape, jax.dtypes.float0) for key, x in flat.items()},)


_unflatten.defvjp(_unflatten_fwd, _unflatten_bwd)


def flat_layout(params: Params, group: Optional[Callable[[str, Any], str]] = None
                ) -> FlatLayout:
    """The layout holding ``params`` (and trees like it) as one flat buffer per dtype.

    Args:
      params: the parameter tree (arrays or ``jax.ShapeDtypeStruct`` s).
      group: ``(key path string, leaf) -> str``: leaves of different groups go to different
        buffers (``"group/dtype"``), for masks and partitions that treat them differently.
        ``None``: one buffer per dtype.

    Returns:
      A :class:`FlatLayout`; leaves keep the tree's order inside each buffer.

    >>> import jax.numpy as jnp, functrain
    >>> params = {'b': jnp.zeros(3), 'w': jnp.zeros((3, 3))}
    >>> sorted(functrain.flat_layout(params, lambda path, x: f"{x.ndim}d").buffers)
    ['1d/float32', '2d/float32']
    """
    paths, leaves, treedef = flatten_with_paths(params)
    keys, offsets, sizes = [], [], {}
    for path, leaf in zip(paths, leaves):
        if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
            raise TypeError(f"flat_layout: leaf {path} is a {type(leaf).__name__}, not an "
                            f"array.")
        dtype = jnp.dtype(leaf.dtype)
        key = dtype.name
        if group is not None:
            label = group(path, leaf)
            if not isinstance(label, str) or not label:
                raise TypeError(f"flat_layout: group gave {label!r} for leaf {path}; "
                                f"expected a non-empty string.")
            key = f"{label}/{dtype.name}"
        keys.append(key)
        offsets.append(sizes.get(key, 0))
        sizes[key] = sizes.get(key, 0) + int(np.prod(leaf.shape))
    dtypes = tuple(jnp.dtype(leaf.dtype) for leaf in leaves)
    buffers = {key: jax.ShapeDtypeStruct((n,), dtypes[keys.index(key)])
               for key, n in sizes.items()}
    return FlatLayout(treedef, tuple(paths), tuple(tuple(leaf.shape) for leaf in leaves),
                      dtypes, tuple(keys), tuple(offsets), buffers)


def _probe_tree(layout: FlatLayout, seed: int) -> PyTree:
    """Random leaves of the layout's shapes, each at its own scale (so a per-leaf norm
    differs from a whole-buffer one)."""
    rng = np.random.default_rng(seed)
    leaves = []
    for i, (shape, dtype) in enumerate(zip(layout.shapes, layout.dtypes)):
        x = rng.standard_normal(shape) * (1 + i % 7) * (3.0 if i % 2 else 1.0)
        if jnp.issubdtype(dtype, jnp.complexfloating):
            x = x + 1j * rng.standard_normal(shape)
        leaves.append(jnp.asarray(x, dtype))
    return layout.treedef.unflatten(leaves)


def _tolerance(dtype: Any) -> float:
    """Relative difference allowed between the two layouts' updates: rounding only (a
    whole-tree sum taken in another order); a per-leaf norm taken over a buffer is off by
    far more, since the probe's leaves differ in scale by up to 21x."""
    return {2: 3e-2, 4: 1e-4}.get(jnp.finfo(dtype).bits // 8, 1e-9)


#: The most elements the check runs on (the probe holds a few trees of the layout's size).
PROBE_ELEMENTS = 2**24


def _probe(inner: Any, layout: FlatLayout, steps: int = 2) -> None:
    """Run ``inner`` on the tree and on the buffers and raise if their updates differ."""
    size = sum(int(np.prod(s)) for s in layout.shapes)
    if size > PROBE_ELEMENTS:
        raise ValueError(
            f"on_flat_layout: the check runs the optimizer on random data of the layout's "
            f"shapes, {size:,} elements here, more than the {PROBE_ELEMENTS:,} it allows; "
            f"check the optimizer on a smaller layout of the same kinds of leaves, then "
            f"pass check=False.")
    try:  # on the host, not in the accelerator's memory
        device = jax.devices("cpu")[0]
    except RuntimeError:  # no CPU backend (JAX_PLATFORMS without it): the default device
        device = None
    with jax.default_device(device):
        _compare(inner, layout, steps)


def _compare(inner: Any, layout: FlatLayout, steps: int) -> None:
    """:func:`_probe`'s two runs and their comparison, on the current default device."""
    params = _probe_tree(layout, 0)
    grads = [_probe_tree(layout, 1 + k) for k in range(steps)]

    def run(p: PyTree, gs: list) -> list:
        state, out = inner.init(p), []
        for g in gs:
            u, state = call_update(inner, g, state, p, {})
            p = apply_updates(p, u)
            out.append(u)
        return out

    with jax.ensure_compile_time_eval():
        on_tree = jax.jit(run)(params, grads)
        on_flat = jax.jit(lambda p, gs: run(layout.flatten(p), [layout.flatten(g) for g in gs]))(
            params, grads)
    wrong = []
    for k, (tree_u, flat_u) in enumerate(zip(on_tree, on_flat)):
        for path, a, b, dtype in zip(layout.paths, jax.tree.leaves(tree_u),
                                     jax.tree.leaves(layout.unflatten(flat_u)),
                                     layout.dtypes):
            a, b = np.asarray(a, np.complex128), np.asarray(b, np.complex128)
            scale = np.max(np.abs(a), initial=0.0)
            if np.max(np.abs(a - b), initial=0.0) > _tolerance(dtype) * scale + 1e-30:
                wrong.append(path)
        if wrong:
            raise ValueError(
                f"on_flat_layout: the optimizer's updates on the flat buffers differ from "
                f"its updates on the tree at step {k + 1}, for leaves "
                f"{format_paths(wrong)}: its step is not per element (a per-leaf norm, "
                f"factored or matrix state, noise, or a mask written for the tree; see "
                f"functrain.flat_layout's docs). Use it on the tree, or group the layout "
                f"and pass masks through FlatLayout.per_buffer.")


def on_flat_layout(inner: GradientTransformation, layout: FlatLayout, check: bool = True
                   ) -> GradientTransformation:
    """Run ``inner`` on params, gradients and state held in ``layout`` 's flat buffers.

    Each step then updates a few 1-D buffers instead of every leaf: on a GPU a 1000-leaf
    AdamW step is 3 kernels at its floor of bytes instead of one kernel per leaf. The
    params, gradients and updates are the ``{buffer key: 1-D array}`` dicts of
    :meth:`FlatLayout.flatten`; the model reads its leaves with :meth:`FlatLayout.unflatten`
    inside the loss, so ``jax.grad`` with respect to the buffers gives flat gradients.

    Args:
      inner: the optimizer, built as for the tree (masks through
        :meth:`FlatLayout.per_buffer`).
      layout: from :func:`flat_layout`.
      check: when building, run ``inner`` two steps on random data of the layout's shapes
        on the tree and on the buffers (on the CPU; it costs about two compiles of the step
        on the tree: 30-60 s for AdamW on 1000 leaves on 2 cores), and raise ``ValueError`` naming the leaves if the updates
        differ beyond rounding; layouts over ``PROBE_ELEMENTS`` (2**24) elements are
        refused. ``False`` skips it (for an optimizer that needs ``update`` keywords such as
        ``value``, or one checked on a smaller layout).

    Returns:
      A ``GradientTransformation`` over the flat buffers; its state is ``inner`` 's for them.

    >>> import jax, jax.numpy as jnp, functrain
    >>> params = {'b': jnp.zeros(2), 'w': jnp.ones((2, 2))}
    >>> layout = functrain.flat_layout(params)
    >>> opt = functrain.on_flat_layout(functrain.adam(0.1), layout)
    >>> flat = layout.flatten(params)
    >>> grads = jax.grad(lambda f: jnp.sum(layout.unflatten(f)['w'] ** 2))(flat)
    >>> updates, state = opt.update(grads, opt.init(flat), flat)
    >>> layout.unflatten(updates)['w'].tolist()
    [[-0.1, -0.1], [-0.1, -0.1]]
    """
    check_transformation(inner, "on_flat_layout")
    if not isinstance(layout, FlatLayout):
        raise TypeError(f"on_flat_layout: layout is a {type(layout).__name__}, not a "
                        f"FlatLayout (functrain.flat_layout(params)).")
    if check:
        _probe(inner, layout)

    def init_fn(params: Params) -> OptState:
        layout.check_flat(params, "on_flat_layout.init: params")
        return inner.init(params)

    def update_fn(updates: Updates, state: OptState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, OptState]:
        layout.check_flat(updates, "on_flat_layout.update: updates")
        if params is not None:
            layout.check_flat(params, "on_flat_layout.update: params")
        return call_update(inner, updates, state, params, extra_args)

    return GradientTransformation(init_fn, update_fn)
