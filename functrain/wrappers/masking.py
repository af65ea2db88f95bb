"""Masking wrappers: ``masked``, ``multi_transform`` / ``partition``, ``freeze``, ``named_chain``.

A wrapper takes one or more ``GradientTransformation`` s (functrain's or
optax's) and restricts them to some leaves. How masks meet the engine:

* every functrain *stage* inside the wrapped optimizer (all of ``adam``, the
  decay of ``adamw``, ...) gets the engine's own per-stage mask, AND-ed with
  any mask it already has, so the masks of nested optimizers keep working,
  masked-out leaves hold :class:`~functrain.tree.MaskedNode` in the state
  (no buffers) and the stages still fuse into one pass;
* a ``masked`` or ``multi_transform`` nested inside another is merged with it
  (the masks are AND-ed) rather than wrapped, with the same state layout;
* anything else (optax transforms, ``MultiSteps``, user code) is handed trees
  whose masked-out leaves are ``MaskedNode`` placeholders, as optax does.

``selective_transform`` (optax's freeze-by-mask) is a partition into the
optimizer and zeros. The other wrappers live in
:mod:`functrain.wrappers.accumulation` (``MultiSteps``),
:mod:`functrain.wrappers.finite` (``apply_if_finite``) and
:mod:`functrain.wrappers.hyperparams` (``inject_hyperparams``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Hashable, Mapping, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from functrain.arg_checks import (check_state_type, check_transformation, sorted_labels,
                                  state_mismatch_error)
from functrain.declarations import record_parts
from functrain import tree as ft
from functrain.engine.protocol import (GradientTransformation, MaskOrFn, MaskedState, OptState,
                                       Params, Updates, call_update)
from functrain.engine.stage import LeafChecks, LeafStage
from functrain.engine.program import Program, fusion_plan, in_masked_state, stage_transform

Array = jax.Array
PyTree = Any

# Attributes on the update functions of masked / multi_transform results, so an
# enclosing mask can merge with them instead of wrapping them.
_MASKED = "_functrain_masked"
_PARTITION = "_functrain_partition"


def _mask_tree(tree: PyTree, flags: list[bool]) -> PyTree:
    """``tree`` with the leaves where ``flags`` is False replaced by ``MaskedNode``."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef.unflatten([x if on else ft.MaskedNode() for x, on in zip(leaves, flags)])


def _fold_subtrees(prefix: Any, flags: list[bool], node: PyTree) -> PyTree:
    """``node`` (a tree with ``prefix`` as a prefix) with one ``MaskedNode`` for each
    subtree at a False flag."""
    return prefix.unflatten([sub if on else ft.MaskedNode()
                             for on, sub in zip(flags, prefix.flatten_up_to(node))])


def _folding(mask: MaskOrFn, params: PyTree, wrapper: str) -> Optional[tuple]:
    """``(params' structure, folded structure, the mask's structure, its flags)`` when
    ``mask`` switches off a whole subtree of ``params`` with one bool (optax then keeps one
    ``MaskedNode`` for it in the state, where the engine keeps one per leaf); ``None`` when
    there is nothing to fold."""
    if mask is None or params is None or ft.is_params_placeholder(params):
        return None
    tree = mask(params) if ft.is_mask_function(mask) else mask
    if isinstance(tree, (bool, np.bool_)) or not jax.tree_util.tree_leaves(tree):
        return None
    ft.resolve_mask(tree, params, wrapper)  # fits params (or raise naming the paths)
    prefix = jax.tree_util.tree_structure(tree)
    flags = [bool(m) for m in prefix.flatten_up_to(tree)]
    if all(on or jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(
            sub, is_leaf=ft.is_placeholder)) for on, sub in zip(flags,
                                                                prefix.flatten_up_to(params))):
        return None
    folded = _fold_subtrees(prefix, flags, params)
    return (jax.tree_util.tree_structure(params), jax.tree_util.tree_structure(folded),
            prefix, flags)


def _refold(state: PyTree, folding: Optional[tuple], fold: bool) -> PyTree:
    """Every params-shaped part of ``state`` with each switched-off subtree as one
    ``MaskedNode`` (``fold``: optax's layout) or as one per leaf (the engine's). Reading
    (``fold=False``) also takes optax's own ``MaskedNode`` class."""
    if folding is None:
        return state
    full, folded, prefix, flags = folding
    params_like = full.unflatten([0] * full.num_leaves)
    source, target = (full, folded) if fold else (folded, full)

    def fits(structure: Any, node: PyTree) -> bool:
        try:
            structure.flatten_up_to(node)
            return True
        except (ValueError, TypeError):
            return False

    def convert(node: PyTree) -> PyTree:
        if fold:
            return _fold_subtrees(prefix, flags, node)
        return jax.tree_util.tree_map(  # each MaskedNode standing for a subtree, per leaf
            lambda n, p: jax.tree_util.tree_map(lambda _: ft.MaskedNode(), p)
            if ft.is_placeholder(n) else n, node, params_like, is_leaf=ft.is_placeholder)

    def walk(node: PyTree) -> PyTree:
        if ft.is_placeholder(node) or fits(target, node):
            return node
        if fits(source, node):
            return convert(node)
        children, node_def = jax.tree_util.tree_flatten(node, is_leaf=lambda x: x is not node)
        if node_def.num_nodes == 1:  # a leaf
            return node
        return node_def.unflatten([walk(c) for c in children])

    if not fold:  # optax's MaskedNode class -> functrain's, so the structures compare
        state = jax.tree_util.tree_map(
            lambda x: ft.MaskedNode() if x is not None and ft.is_placeholder(x) else x,
            state, is_leaf=ft.is_placeholder)
    return walk(state)


def _merge(new_masked: PyTree, old: PyTree, flags: list[bool]) -> PyTree:
    """Leaves of ``new_masked`` where ``flags`` is True, of ``old`` elsewhere."""
    old_leaves, treedef = jax.tree_util.tree_flatten(old)
    new_leaves = treedef.flatten_up_to(new_masked)
    return treedef.unflatten([n if on else o for n, o, on in zip(new_leaves, old_leaves, flags)])


# --------------------------------------------------------------------------
# masked
# --------------------------------------------------------------------------

def _stage_mask(outer: MaskOrFn, inner: MaskOrFn, wrapper: str) -> Callable[[PyTree], PyTree]:
    """A mask function: ``outer`` and ``inner`` resolved on the same tree, AND-ed."""
    def mask_fn(tree: PyTree) -> PyTree:
        flags = ft.resolve_mask(outer, tree, wrapper)
        if inner is not None:
            flags = [a and b for a, b in zip(flags, ft.resolve_mask(inner, tree, wrapper))]
        return jax.tree_util.tree_structure(tree, is_leaf=ft.is_placeholder).unflatten(flags)
    return mask_fn


def _masked_stage(stage: LeafStage, mask: MaskOrFn, wrapper: str) -> LeafStage:
    """``stage`` restricted to ``mask`` by the engine's own per-stage mask.

    A stage whose ``prepare`` reads the whole tree (a global norm) is shown
    only the masked-in leaves, as it would be inside optax's ``masked``.
    """
    combined = _stage_mask(mask, stage.mask, f"{wrapper}({stage.name})")
    new = dataclasses.replace(stage, mask=combined)
    if stage.needs_updates:
        prepare = stage.prepare

        def masked_prepare(glob: dict, updates: Updates, **extra: Any) -> tuple:
            flags = ft.resolve_leaf_mask(combined, updates, wrapper)
            return prepare(glob, _mask_tree(updates, flags), **extra)

        new = dataclasses.replace(new, prepare=masked_prepare)
    return new


def _generic_masked(inner: Any, mask: MaskOrFn, wrapper: str,
                    mask_compatible_extra_args: bool) -> GradientTransformation:
    """Mask any transformation by handing it trees with ``MaskedNode`` placeholders."""
    def init_fn(params: Params) -> OptState:
        return inner.init(_mask_tree(params, ft.resolve_leaf_mask(mask, params, wrapper)))

    def update_fn(updates: Updates, state: OptState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, OptState]:
        if params is not None:
            ft.check_structure(updates, params, "params", "updates")
        flags = ft.resolve_leaf_mask(mask, params if params is not None else updates, wrapper)
        if mask_compatible_extra_args:
            structure = jax.tree_util.tree_structure(updates)
            extra_args = {k: _mask_tree(v, flags)
                          if jax.tree_util.tree_structure(v) == structure else v
                          for k, v in extra_args.items()}
        new, new_state = call_update(
            inner, _mask_tree(updates, flags), state,
            None if params is None else _mask_tree(params, flags), extra_args)
        return _merge(new, updates, flags), new_state

    return GradientTransformation(init_fn, update_fn)


def _and(first: MaskOrFn, second: MaskOrFn, wrapper: str) -> MaskOrFn:
    return second if first is None else _stage_mask(second, first, wrapper)


def _masked_part(tx: Any, mask: MaskOrFn, wrapper: str, extra: bool) -> GradientTransformation:
    """``tx`` restricted to ``mask``, keeping exactly ``tx`` 's state layout."""
    spec = getattr(getattr(tx, "update", None), _MASKED, None)
    if spec is not None:
        inner, inner_mask, inner_extra = spec
        return masked(inner, _and(inner_mask, mask, wrapper),
                      mask_compatible_extra_args=inner_extra or extra)
    spec = getattr(getattr(tx, "update", None), _PARTITION, None)
    if spec is not None:
        transforms, labels, outer, inner_extra = spec
        return _partition(transforms, labels, _and(outer, mask, wrapper), inner_extra or extra)
    plan = fusion_plan(tx)
    if len(plan) == 1 and plan[0][0] == ():
        item = plan[0][1]
        if isinstance(item, LeafStage):
            return stage_transform(_masked_stage(item, mask, wrapper))
        return _generic_masked(tx, mask, wrapper, extra)
    # A functrain chain: the same program with each step masked (each part's state at its
    # path in the chain's nested state), so its stages still fuse.
    steps = tuple((path, _masked_stage(item, mask, wrapper)) if isinstance(item, LeafStage)
                  else (path, _masked_part(item, mask, wrapper, extra)) for path, item in plan)

    def init_fn(params: Params) -> OptState:
        # The nesting of tx's state (every part is replaced below), from params with
        # the masked-out leaves left out, so that tx.init never sees those leaves.
        flags = ft.resolve_leaf_mask(mask, params, wrapper)
        # A fresh function: tx.init may be an Equinox closure holding tracers, which jax's
        # function caches cannot hash.
        state = jax.eval_shape(lambda p: tx.init(p), _mask_tree(params, flags))
        for path, item in steps:
            part = item.init_state(params) if isinstance(item, LeafStage) else item.init(params)
            state = ft.set_path(state, path, part)
        return state

    return GradientTransformation(init_fn, Program(steps))


def _masked_single_stage(stage: LeafStage, mask: MaskOrFn,
                         wrapper: str) -> GradientTransformation:
    """One stage restricted to ``mask`` in optax's layout, ``MaskedState(stage's state)``;
    the engine reads a whole switched-off subtree's one ``MaskedNode``, so it still fuses."""
    masked_stage = _masked_stage(stage, mask, wrapper)

    def init_fn(params: Params) -> MaskedState:
        return MaskedState(_refold(masked_stage.init_state(params),
                                   _folding(mask, params, wrapper), True))

    return in_masked_state(stage_transform(masked_stage), wrapper, init_fn)


def masked(inner: GradientTransformation, mask: MaskOrFn, *,
           mask_compatible_extra_args: bool = False) -> GradientTransformation:
    """Apply ``inner`` only where ``mask`` is True; other leaves pass through unchanged.

    ``mask`` is a tree of bools shaped like the params, a prefix of it (one
    bool for a whole subtree), or a function of the params returning one.
    Masked-out leaves hold no state in ``inner``. A mask that does not fit
    the params raises a ``ValueError`` naming the key paths and the wrapper.
    With ``mask_compatible_extra_args``, extra arguments shaped like the
    updates are masked too (as optax). The state is
    ``MaskedState(inner_state)``, as optax's; when ``inner`` is a single stage
    (``add_decayed_weights``, ``set_to_zero``, ``scale_by_adam``, ...) that
    stage still fuses into an outer ``chain``.

    Args:
      inner: the transformation to restrict (functrain's, optax's, or any
        object with ``init`` and ``update``).
      mask: where to apply ``inner``: a tree of bools shaped like the params,
        a prefix of it, or a function of the params (or, without params, of
        the updates) returning one. True: ``inner`` updates the leaf; False:
        the leaf's update passes through unchanged.
      mask_compatible_extra_args: if True, keyword arguments of ``update``
        whose tree structure equals the updates' are masked like them before
        reaching ``inner``; others are passed as they are. False (the
        default) passes all of them unchanged.

    Returns:
      A ``GradientTransformation`` whose state is ``MaskedState(inner_state)``.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.masked(functrain.add_decayed_weights(0.5), {'w': True, 'b': False})
    >>> params = {'w': jnp.array([2.]), 'b': jnp.array([2.])}
    >>> tx.update({'w': jnp.zeros(1), 'b': jnp.zeros(1)}, tx.init(params), params)[0]
    {'b': Array([0.], dtype=float32), 'w': Array([1.], dtype=float32)}
    """
    check_transformation(inner, "masked")
    plan = fusion_plan(inner)
    if len(plan) == 1 and plan[0][0] == () and isinstance(plan[0][1], LeafStage):
        result = _masked_single_stage(plan[0][1], mask, "masked")
        record_parts(result, [(("inner_state",), inner)], "masked")  # current_hyperparams
        return result
    part = _masked_part(inner, mask, "masked", mask_compatible_extra_args)

    # optax's layout: where the mask switches off a whole subtree with one bool, the inner
    # state holds one MaskedNode for it (the engine works with one per leaf in between).
    def init_fn(params: Params) -> MaskedState:
        return MaskedState(_refold(part.init(params), _folding(mask, params, "masked"), True))

    def update_fn(updates: Updates, state: MaskedState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, MaskedState]:
        check_state_type(state, MaskedState, "masked")
        folding = _folding(mask, params if params is not None else updates, "masked")
        new_updates, inner_state = part.update(
            updates, _refold(state.inner_state, folding, False), params, **extra_args)
        return new_updates, MaskedState(_refold(inner_state, folding, True))

    setattr(update_fn, _MASKED, (inner, mask, mask_compatible_extra_args))
    result = GradientTransformation(init_fn, update_fn)
    record_parts(result, [(("inner_state",), inner)], "masked")
    return result


# --------------------------------------------------------------------------
# multi_transform / partition
# --------------------------------------------------------------------------

class PartitionState(NamedTuple):
    """State of :func:`multi_transform`: each label's (masked) inner state.

    ``MultiTransformState`` is the same class.

    Attributes:
      inner_states: a dict from each label to the state of its
        transformation, which holds buffers only for the leaves with that
        label (``MaskedNode`` placeholders elsewhere).

    >>> PartitionState(inner_states={'adam': ()})
    PartitionState(inner_states={'adam': ()})
    """

    inner_states: Mapping[Hashable, Any]


MultiTransformState = PartitionState


def _leaf_labels(param_labels: Any, tree: PyTree, wrapper: str) -> list[Any]:
    """One label per leaf slot of ``tree`` (placeholders included)."""
    labels = param_labels(tree) if callable(param_labels) else param_labels
    label_def = jax.tree_util.tree_structure(labels)
    try:
        subtrees = label_def.flatten_up_to(tree)
    except (ValueError, TypeError):
        ft.check_structure(labels, tree, "params", f"the param_labels of {wrapper}",
                           prefix=True)
        raise ValueError(f"the param_labels of {wrapper} do not fit the params tree "
                         f"(labels: {label_def}; params: "
                         f"{jax.tree_util.tree_structure(tree)}).") from None
    out = []
    for label, sub in zip(jax.tree_util.tree_leaves(labels), subtrees):
        out.extend([label] * len(jax.tree_util.tree_leaves(sub, is_leaf=ft.is_placeholder)))
    return out


def multi_transform(transforms: Mapping[Hashable, GradientTransformation],
                    param_labels: Any, *, mask_compatible_extra_args: bool = False
                    ) -> GradientTransformation:
    """A different transformation per group of leaves (``partition`` is the same function).

    ``param_labels`` is a tree of labels shaped like the params (or a prefix,
    or a function of the params); leaves labelled ``k`` are updated by
    ``transforms[k]`` alone, which holds state for those leaves only. A label
    without a transformation is a ``ValueError`` listing the labels on both
    sides. A transformation whose label no leaf has is allowed, as in optax (its
    state is that of an all-masked tree), so one labelling function serves
    models with and without, say, matrices.

    Args:
      transforms: a mapping from label to ``GradientTransformation``
        (functrain's or optax's); a non-mapping is a ``TypeError``.
      param_labels: the label of each leaf: a tree of labels (hashables)
        shaped like the params, a prefix of it (one label for a whole
        subtree), or a function of the params returning one.
      mask_compatible_extra_args: if True, keyword arguments of ``update``
        shaped like the updates are masked to each group before reaching its
        transformation (as in :func:`masked`); False (the default) passes
        them unchanged.

    Returns:
      A ``GradientTransformation`` whose state is
      ``PartitionState(inner_states)``, with one entry per label, as optax's.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.multi_transform({'fast': functrain.sgd(1.0), 'slow': functrain.sgd(0.1)},
    ...                                {'a': 'fast', 'b': 'slow'})
    >>> params = {'a': jnp.ones(1), 'b': jnp.ones(1)}
    >>> tx.update({'a': jnp.ones(1), 'b': jnp.ones(1)}, tx.init(params))[0]
    {'a': Array([-1.], dtype=float32), 'b': Array([-0.1], dtype=float32)}
    """
    if not isinstance(transforms, Mapping):
        raise TypeError(f"multi_transform: transforms must be a mapping from label to "
                        f"GradientTransformation, got {type(transforms).__name__}.")
    for label, tx in transforms.items():
        check_transformation(tx, "multi_transform", f"transforms[{label!r}]")
    return _partition(dict(transforms), param_labels, None, mask_compatible_extra_args)


partition = multi_transform


def _partition(transforms: dict, param_labels: Any, outer: MaskOrFn,
               extra: bool) -> GradientTransformation:
    """``multi_transform``, further restricted to ``outer`` (a mask, or None)."""
    def labels_of(tree: PyTree) -> list[Any]:
        labels = _leaf_labels(param_labels, tree, "multi_transform")
        used = set(labels)
        missing = used - set(transforms)
        if missing:
            what = f"labels {sorted_labels(missing)} have no transformation"
            raise ValueError(f"multi_transform: {what}. Labels in param_labels: "
                             f"{sorted_labels(used)}; labels in transforms: {sorted_labels(transforms)}.")
        return labels

    def group_mask(label: Hashable) -> Callable[[PyTree], PyTree]:
        def mask_fn(tree: PyTree) -> PyTree:
            flags = [lab == label for lab in labels_of(tree)]
            return jax.tree_util.tree_structure(tree, is_leaf=ft.is_placeholder).unflatten(flags)
        return _and(outer, mask_fn, "multi_transform")

    groups = {label: masked(tx, group_mask(label), mask_compatible_extra_args=extra)
              for label, tx in transforms.items()}

    def init_fn(params: Params) -> PartitionState:
        if not ft.is_params_placeholder(params):  # optax.tree.map_params passes one
            labels_of(params)
        return PartitionState({label: tx.init(params) for label, tx in groups.items()})

    def update_fn(updates: Updates, state: PartitionState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, PartitionState]:
        check_state_type(state, PartitionState, "multi_transform")
        labels_of(params if params is not None else updates)
        if set(state.inner_states) != set(groups):
            raise state_mismatch_error("multi_transform", f"the state holds labels "
                                       f"{sorted_labels(state.inner_states)} but the "
                                       f"transforms are {sorted_labels(groups)}",
                                       "this wrapper")
        new_states = {}
        for label, tx in groups.items():
            updates, new_states[label] = tx.update(updates, state.inner_states[label], params,
                                                   **extra_args)
        return updates, PartitionState(new_states)

    setattr(update_fn, _PARTITION, (transforms, param_labels, outer, extra))
    result = GradientTransformation(init_fn, update_fn)
    # current_hyperparams: each label's names as '<label>/<name>', read from its state.
    record_parts(result, [(("inner_states", label, "inner_state"), tx)
                          for label, tx in transforms.items()], "multi_transform", transforms)
    return result


# --------------------------------------------------------------------------
# set_to_zero, freeze
# --------------------------------------------------------------------------

def freeze(mask: MaskOrFn) -> GradientTransformation:
    """Zero the updates of the leaves where ``mask`` is True (frozen: no state, no update).

    Other leaves pass through; chain it with an optimizer masked the other way
    (or use ``multi_transform``) so frozen leaves also hold no optimizer state.

    Args:
      mask: the leaves to freeze: a tree of bools shaped like the params, a
        prefix of it, or a function of the params returning one. True: the
        update is replaced by zeros; False: it passes through unchanged.

    Returns:
      A ``GradientTransformation`` whose state is
      ``MaskedState(inner_state=EmptyState())``, as optax's (``masked(set_to_zero(),
      mask)``); it is a single stage, so it fuses into an outer ``chain``.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.freeze({'emb': True, 'head': False})
    >>> params = {'emb': jnp.ones(1), 'head': jnp.ones(1)}
    >>> tx.update({'emb': jnp.ones(1), 'head': jnp.ones(1)}, tx.init(params))[0]
    {'emb': Array([0.], dtype=float32), 'head': Array([1.], dtype=float32)}
    """
    return in_masked_state(stage_transform(_zeros(_stage_mask(mask, None, "freeze"))),
                           "freeze")


def _zeros(mask: MaskOrFn) -> LeafStage:
    """The stage that zeros the updates where ``mask`` is True (``set_to_zero``'s math)."""
    return LeafStage(name="freeze", update_leaf=lambda g, s, p, c: (jnp.zeros_like(g), ()),
                     mask=mask, checks=LeafChecks(any_dtype=True))


def selective_transform(optimizer: GradientTransformation, *,
                        freeze_mask: Any) -> GradientTransformation:
    """Train the leaves where ``freeze_mask`` is False with ``optimizer``; zero the others.

    A :func:`partition` into ``{'train': optimizer, 'freeze': zeros}``: frozen
    leaves get zero updates and no optimizer state (``MaskedNode``), as in
    optax. The mask is static (Python bools known when the step is traced).

    Args:
      optimizer: the optimizer for the trained leaves (functrain's, optax's,
        or any object with ``init`` and ``update``).
      freeze_mask: keyword-only; a bool (True: freeze everything, False:
        nothing) or a tree of bools shaped like the params (or a prefix of
        it), True where a leaf is frozen.

    Returns:
      A ``GradientTransformation`` whose state is ``PartitionState`` with the
      labels ``'train'`` and ``'freeze'``, as optax's.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.selective_transform(functrain.sgd(1.0),
    ...                                    freeze_mask={'emb': True, 'head': False})
    >>> params = {'emb': jnp.ones(1), 'head': jnp.ones(1)}
    >>> tx.update({'emb': jnp.ones(1), 'head': jnp.ones(1)}, tx.init(params))[0]
    {'emb': Array([0.], dtype=float32), 'head': Array([-1.], dtype=float32)}
    """
    check_transformation(optimizer, "selective_transform", "optimizer")
    if callable(freeze_mask):
        raise TypeError("selective_transform: freeze_mask must be a bool or a tree of bools "
                        "(a static mask), not a function; use masked or multi_transform "
                        "for masks computed from the params.")
    paths, flags, treedef = ft.flatten_with_paths(freeze_mask)
    labels = []
    for path, flag in zip(paths, flags):
        if not isinstance(flag, (bool, np.bool_)) and not (
                isinstance(flag, (np.ndarray, jax.Array)) and np.shape(flag) == ()
                and np.asarray(flag).dtype == np.bool_):
            raise TypeError(f"selective_transform: freeze_mask{path} must be a bool, got "
                            f"{type(flag).__name__} {flag!r:.40}.")
        labels.append("freeze" if bool(flag) else "train")
    labels_tree = treedef.unflatten(labels)
    return _partition({"train": optimizer, "freeze": stage_transform(_zeros(None))},
                      lambda params: labels_tree, None, False)
