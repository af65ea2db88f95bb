"""Opt-in grouped engine (issue 5, proposal P2): same-shape leaves as one vmapped kernel.

:func:`grouped` wraps a transformation made only of functrain leaf stages.
Leaves with the same shape, dtype and per-stage mask flags are put in groups
of at most ``max_group`` leaves; each group's optimizer state is stored
*stacked* (one ``[k, *shape]`` array per state field), and the block's fused
per-leaf update runs once per group under :func:`jax.vmap`. The per-leaf math
is the engine's own: every group (and the set of ungrouped leaves) goes
through :func:`functrain.transforms.engine.run_block`, with each stage's
``prepare`` run once per step on the whole tree first, so step counts,
schedules and global norms (``clip_by_global_norm``) are exactly those of the
ungrouped chain, and norms stay per leaf (``vmap`` reduces over each leaf's
own axes).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp

from functrain import tree as ft
from functrain.transforms.base import EmptyState, GradientTransformation, LeafStage
from functrain.transforms.engine import fusion_plan, prepare_stage, run_block

PyTree = Any


class GroupedState(NamedTuple):
    """The state of :func:`grouped`; its layout is functrain's own, not optax's.

    Attributes:
      groups: one entry per group of leaves; each is a tuple (one per stage of
        the wrapped transformation's plan) of tuples (one per per-leaf state
        field) of stacked ``[k, *shape]`` arrays, or ``MaskedNode()`` where the
        stage is masked off for the group.
      singles: the ungrouped leaves' state: a tuple (per stage) of tuples (per
        field) of tuples with one entry per ungrouped leaf, in tree order.
      globals: a tuple (per stage) of dicts of the stage's scalar fields
        (e.g. ``count``).

    The wrapped transformation's state (e.g. ``ScaleByAdamState``) is not
    kept, so a ``GroupedState`` cannot be handed to the unwrapped optimizer or
    to optax, nor restored from their checkpoints.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.grouped(functrain.sgd(0.1, momentum=0.9))
    >>> state = tx.init([jnp.zeros(3), jnp.zeros(3)])
    >>> state.groups[0][0][0].shape
    (2, 3)
    """

    groups: tuple
    singles: tuple
    globals: tuple


@dataclasses.dataclass(frozen=True)
class _Layout:
    chunks: tuple          # per group: tuple of leaf indices
    chunk_flags: tuple     # per group: tuple of per-stage active flags
    singles: tuple         # ungrouped leaf indices, in tree order
    flags: tuple           # per stage: tuple of per-leaf active flags


def _stages_of(tx: Any) -> list[LeafStage]:
    if not (callable(getattr(tx, "init", None)) and callable(getattr(tx, "update", None))):
        raise TypeError(f"grouped expects a GradientTransformation (an object with init and "
                        f"update), got a {type(tx).__name__}.")
    stages = []
    for path, item in fusion_plan(tx):
        if not isinstance(item, LeafStage):
            name = getattr(getattr(item, "update", None), "__qualname__", type(item).__name__)
            where = f" (chain position {list(path)})" if path else ""
            raise TypeError(
                f"grouped only runs transformations made of functrain leaf stages; "
                f"{name}{where} is not one (e.g. an optax transformation or a wrapper such "
                f"as masked/inject_hyperparams).")
        stages.append(item)
    return stages


def _layout(stages: Sequence[LeafStage], source: PyTree, leaves: Sequence[Any],
            max_group: int, max_leaf_size: Optional[int]) -> _Layout:
    flags = tuple(tuple(ft.resolve_leaf_mask(s.mask, source, s.name)) for s in stages)
    by_key: dict[tuple, list[int]] = {}
    singles = []
    for i, x in enumerate(leaves):
        shape, dtype = jnp.shape(x), jnp.result_type(x)
        size = 1
        for d in shape:
            size *= d
        if max_leaf_size is not None and size > max_leaf_size:
            singles.append(i)
            continue
        by_key.setdefault((shape, dtype, tuple(f[i] for f in flags)), []).append(i)
    chunks, chunk_flags = [], []
    for key, idx in by_key.items():
        for start in range(0, len(idx), max_group):
            chunk = idx[start:start + max_group]
            if len(chunk) == 1:
                singles.append(chunk[0])
            else:
                chunks.append(tuple(chunk))
                chunk_flags.append(key[2])
    return _Layout(tuple(chunks), tuple(chunk_flags), tuple(sorted(singles)), flags)


def _frozen(stage: LeafStage, ctx: Any, mask: Any) -> LeafStage:
    """``stage`` with this step's ``prepare`` result fixed and a local mask."""
    return dataclasses.replace(stage, prepare=lambda g, u: (ctx, g), needs_updates=False,
                               extra_args=(),
                               mask=mask)


def _blocks(stages: Sequence[LeafStage]) -> list[list[int]]:
    """Stage indices in blocks as ``chain`` fuses them: a needs_updates stage starts one."""
    blocks: list[list[int]] = []
    for k, s in enumerate(stages):
        if not blocks or s.needs_updates:
            blocks.append([])
        blocks[-1].append(k)
    return blocks


def _check_state(state: Any, stages: Sequence[LeafStage], layout: _Layout,
                 paths: Sequence[str], gs: Sequence[Any]) -> None:
    if not isinstance(state, GroupedState):
        raise TypeError(f"grouped expected its state as GroupedState, got "
                        f"{type(state).__name__}: was the state made by this optimizer's init?")
    if (len(state.groups) != len(layout.chunks) or len(state.globals) != len(stages)
            or len(state.singles) != len(stages)):
        raise ValueError("grouped: the state does not fit this tree's grouping (number of "
                         "groups or stages differs): was it made by this optimizer's init "
                         "on params of the same structure, shapes and dtypes?")
    for k, stage in enumerate(stages):
        shaped = [j for j, nm in enumerate(stage.leaf_fields)
                  if stage.shaped_fields is None or nm in stage.shaped_fields]
        for c, idx in enumerate(layout.chunks):
            if not layout.chunk_flags[c][k]:
                continue
            for j in shaped:
                want = (len(idx),) + tuple(jnp.shape(gs[idx[0]]))
                got = tuple(jnp.shape(state.groups[c][k][j]))
                if got != want:
                    raise ValueError(
                        f"grouped: {stage.name} state .{stage.leaf_fields[j]} of the group "
                        f"{ft.format_paths([paths[i] for i in idx])} has shape {got}, expected "
                        f"{want}: was the state made by this optimizer's init?")
        for j in shaped:
            field = state.singles[k][j] if stage.state_cls is not None else ()
            if len(field) != len(layout.singles):
                raise ValueError("grouped: the state does not fit this tree's ungrouped "
                                 "leaves: was it made by this optimizer's init?")
            ft.check_shapes([paths[i] for i in layout.singles],
                            [gs[i] for i in layout.singles], list(field), "grouped state "
                            f"{stage.name} .{stage.leaf_fields[j]}", "updates")
    for idx in layout.chunks:
        dts = {jnp.result_type(gs[i]) for i in idx}
        if len(dts) > 1:
            raise ValueError(f"grouped: updates {ft.format_paths([paths[i] for i in idx])} share "
                             f"a group but have different dtypes {sorted(map(str, dts))}.")


def grouped(tx: GradientTransformation, max_group: int = 16,
            max_leaf_size: Optional[int] = None) -> GradientTransformation:
    """``tx`` with same-shape leaves updated as one vmapped kernel per group.

    Opt-in engine for trees of many small leaves (e.g. transformers' biases and
    norm scales): leaves with equal shape, dtype and per-stage mask flags are
    grouped (at most ``max_group`` a group; only leaves of at most
    ``max_leaf_size`` elements if given); each group's state is stored stacked
    (``[k, *shape]``) and the fused per-leaf update runs once per group under
    ``jax.vmap``. The numbers are those of ``tx`` (per-leaf norms, masks,
    dtype policy and whole-tree stages such as ``clip_by_global_norm``
    unchanged, up to float32 rounding: XLA may schedule the vmapped
    arithmetic differently; within rtol 1e-6 after 20 steps in the tests),
    and compiling is much faster at many leaves. Params and grads are stacked every step,
    which costs bandwidth on large leaves: use ``max_leaf_size`` there.

    The state is a :class:`GroupedState`, whose layout differs from ``tx``'s
    (and optax's); it is not interchangeable with theirs.

    Args:
      tx: a transformation whose plan is only functrain leaf stages, e.g.
        ``functrain.lamb(...)`` or ``chain(clip_by_global_norm(1.), adam(...))``;
        anything else (optax transformations, wrappers) raises ``TypeError``.
      max_group: most leaves in one group, an int ``>= 1`` (XLA:CPU compiles
        k slices of one array in O(k^2) time, so keep it small).
      max_leaf_size: if given, leaves with more elements are not grouped
        (they are updated one by one, as by ``tx``); ``None`` (the default)
        groups leaves of any size.

    Returns:
      A ``GradientTransformation`` with ``tx``'s numbers whose state is a
      :class:`GroupedState`.

    >>> import jax, jax.numpy as jnp, functrain
    >>> params = {f'b{i}': jnp.ones(4) for i in range(3)}
    >>> tx = functrain.grouped(functrain.lamb(1e-2))
    >>> state = tx.init(params)
    >>> updates, state = jax.jit(tx.update)(params, state, params)
    >>> updates['b0']
    Array([-0.01, -0.01, -0.01, -0.01], dtype=float32)
    """
    stages = _stages_of(tx)
    if isinstance(max_group, bool) or not isinstance(max_group, int) or max_group < 1:
        raise ValueError(f"grouped: max_group must be an int >= 1, got {max_group!r}.")
    if max_leaf_size is not None and (isinstance(max_leaf_size, bool)
                                      or not isinstance(max_leaf_size, int)
                                      or max_leaf_size < 0):
        raise ValueError(f"grouped: max_leaf_size must be None or an int >= 0, "
                         f"got {max_leaf_size!r}.")
    blocks = _blocks(stages)

    def init_fn(params: PyTree) -> GroupedState:
        _, ps, _ = ft.flatten_with_paths(params)
        layout = _layout(stages, params, ps, max_group, max_leaf_size)
        groups = []
        for idx, fl in zip(layout.chunks, layout.chunk_flags):
            stacked = jnp.stack([jnp.asarray(ps[i]) for i in idx])
            per_stage = []
            for k, stage in enumerate(stages):
                if stage.state_cls is None:
                    per_stage.append(())
                elif not fl[k]:
                    per_stage.append((ft.MaskedNode(),) * len(stage.leaf_fields))
                else:
                    per_stage.append(tuple(jax.vmap(lambda p, s=stage: tuple(s.init_leaf(p)))(
                        stacked)))
            groups.append(tuple(per_stage))
        singles = []
        for k, stage in enumerate(stages):
            if stage.state_cls is None:
                singles.append(())
                continue
            per_leaf = [stage.init_leaf(jnp.asarray(ps[i])) if layout.flags[k][i]
                        else (ft.MaskedNode(),) * len(stage.leaf_fields) for i in layout.singles]
            singles.append(tuple(tuple(v[j] for v in per_leaf)
                                 for j in range(len(stage.leaf_fields))))
        glob = tuple(dict(s.init_global()) if s.state_cls is not None else {} for s in stages)
        return GroupedState(tuple(groups), tuple(singles), glob)

    def update_fn(updates: PyTree, state: GroupedState, params: Optional[PyTree] = None,
                  **extra_args: Any) -> tuple[PyTree, GroupedState]:
        paths, gs, treedef = ft.flatten_with_paths(updates)
        if params is not None:
            ft.check_structure(updates, params, "params", "updates")
            ps = treedef.flatten_up_to(params)
            ft.check_shapes(paths, ps, gs, "updates", "params")
            source, key_leaves = params, ps
        else:
            ps = [None] * len(gs)
            source, key_leaves = updates, gs
        layout = _layout(stages, source, key_leaves, max_group, max_leaf_size)
        _check_state(state, stages, layout, paths, gs)
        has_p = params is not None
        groups = [list(map(list, g)) for g in state.groups]
        singles = list(state.singles)
        globs = list(state.globals)
        cur = list(gs)
        for block in blocks:
            ctxs = {}
            for k in block:
                stage = stages[k]
                ctxs[k], globs[k] = prepare_stage(stage, dict(state.globals[k]),
                                                  treedef.unflatten(cur), extra_args)
            out = list(cur)
            for c, (idx, fl) in enumerate(zip(layout.chunks, layout.chunk_flags)):
                local = [_frozen(stages[k], ctxs[k], fl[k]) for k in block]

                def one(g: Any, p: Any, fields: tuple, local: list = local) -> tuple:
                    sts = [EmptyState() if s.state_cls is None else s.state_cls(
                        **{n: None for n in s.global_fields},
                        **{n: [f] for n, f in zip(s.leaf_fields, fs)})
                        for s, fs in zip(local, fields)]
                    u, new = run_block(local, [g], sts, None if p is None else [p])
                    return u[0], tuple(() if s.state_cls is None else
                                       tuple(getattr(n, f)[0] for f in s.leaf_fields)
                                       for s, n in zip(local, new))

                G = jnp.stack([cur[i] for i in idx])
                P = jnp.stack([ps[i] for i in idx]) if has_p else None
                U, new = jax.vmap(one)(G, P, tuple(tuple(groups[c][k]) for k in block))
                for j, i in enumerate(idx):
                    out[i] = U[j]
                for k, nf in zip(block, new):
                    groups[c][k] = list(nf)
            if layout.singles:
                sl = list(layout.singles)
                local = [_frozen(stages[k], ctxs[k], [layout.flags[k][i] for i in sl])
                         for k in block]
                sts = [EmptyState() if s.state_cls is None else s.state_cls(
                    **{n: None for n in s.global_fields},
                    **{n: list(f) for n, f in zip(s.leaf_fields, singles[k])})
                    for k, s in zip(block, local)]
                u, new = run_block(local, [cur[i] for i in sl], sts,
                                   [ps[i] for i in sl] if has_p else None)
                for j, i in enumerate(sl):
                    out[i] = u[j]
                for k, s, n in zip(block, local, new):
                    if s.state_cls is not None:
                        singles[k] = tuple(tuple(getattr(n, f)) for f in s.leaf_fields)
            cur = out
        new_state = GroupedState(tuple(tuple(tuple(f) for f in g) for g in groups),
                                 tuple(singles), tuple(globs))
        return treedef.unflatten(cur), new_state

    return GradientTransformation(init_fn, update_fn)
