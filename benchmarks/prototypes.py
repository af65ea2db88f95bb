"""Prototypes of tree-engine changes, measured by ``benchmarks/run.py --libs``.

Nothing here is imported by functrain: these are experiments for the engine's
owner, run against the real functrain stages (the ``LeafStage`` plan that
``chain`` records on its update function), so the per-leaf math is exactly
functrain's and only the *schedule* changes. Use them as libraries (``lib`` below parses the names)::

    python benchmarks/run.py --libs functrain,optax,proto-tr-stacked-max16 --cases 1000@4M

* ``group``: leaves with the same shape, dtypes and masks are stacked and the
  fused per-leaf function runs once per group under ``jax.vmap`` (norms stay
  per leaf: ``vmap`` reduces over each leaf's own axes). The state keeps
  functrain's layout (one array per leaf), so params, grads and every state
  leaf are stacked and unstacked inside the step.
* ``stacked``: the same, with the optimizer state stored stacked per group (a
  different state layout): only params and grads are stacked and only the
  updates unstacked.
* ``max<K>``: groups split into chunks of at most K leaves (XLA:CPU compiles
  k slices of one array in O(k^2) time: 1000 slices take 35 s).
* ``small<N>``: only leaves of at most N elements are grouped.
* ``copy``: the stacks are materialized (an ``optimization_barrier`` after
  ``jnp.stack``), so XLA does not fuse a k-operand concatenate into every
  consumer.
* ``scratch``: the trust-ratio stage keeps a params-shaped scratch buffer in
  its state (donated), so the materialized update direction is not a fresh
  allocation each step.
* ``tr``: the trust ratio's zero test on the squared norms (bit-identical;
  one scalar kernel per leaf instead of three).
"""

from __future__ import annotations

import contextlib
from typing import Any, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp

import functrain
from functrain import tree as ft
from functrain.transforms.base import LeafStage, _compute, _global_names

PLAN_ATTR = "_functrain_plan"


# --------------------------------------------------------------------------
# The grouped leaf pass
# --------------------------------------------------------------------------

def _leaf_fn(stages: Sequence[LeafStage], actives: Sequence[bool], ctxs: Sequence[Any],
             has_p: bool):
    """The fused per-leaf function of a block: (g, p, fields) -> (u, new fields)."""
    def fn(g, p, fields):
        cd = ft.compute_dtype(g.dtype if not has_p else jnp.promote_types(g.dtype, p.dtype))
        x = g.astype(cd)
        pc = p.astype(cd) if has_p else None
        out_fields = []
        for k, stage in enumerate(stages):
            olds = fields[k]
            if not actives[k]:
                news = olds
            else:
                x, news = stage.update_leaf(
                    x, tuple(o.astype(_compute(o, cd)) for o in olds), pc, ctxs[k])
                news = tuple(n.astype(o.dtype) for n, o in zip(news, olds))
            out_fields.append(tuple(news))
        return x.astype(g.dtype), tuple(out_fields)
    return fn


def _group_key(i: int, gs, ps, fields_per_stage, actives) -> tuple:
    g = gs[i]
    key = [g.shape, g.dtype, None if ps[i] is None else ps[i].dtype]
    for k, fields in enumerate(fields_per_stage):
        key.append(actives[k][i])
        key.extend((f[i].shape, f[i].dtype) if hasattr(f[i], "shape") else ("mask",)
                   for f in fields)
    return tuple(key)


def _stack(xs: list, materialize: bool) -> jax.Array:
    """Stack leaves into [k, *shape]; ``materialize`` keeps XLA from fusing the
    k-operand concatenate into every consumer (which makes compiles explode)."""
    s = jnp.stack(xs)
    return jax.lax.optimization_barrier(s) if materialize else s


def grouped_block(stages: Sequence[LeafStage], updates: Any, states: Sequence[Any],
                  params: Optional[Any], min_group: int = 2,
                  max_leaf_size: Optional[int] = None,
                  materialize: bool = False, max_group: int = 0) -> tuple[Any, list]:
    """``run_block`` with same-shape leaves stacked and vmapped (state layout kept)."""
    gs, treedef = jax.tree_util.tree_flatten(updates)
    ps = treedef.flatten_up_to(params) if params is not None else [None] * len(gs)
    mask_source = params if params is not None else updates
    actives, fields_per_stage, ctxs, globals_ = [], [], [], []
    for stage, state in zip(stages, states):
        actives.append(ft.resolve_mask(stage.mask, mask_source, stage.name))
        fields_per_stage.append([treedef.flatten_up_to(getattr(state, nm))
                                 for nm in stage.leaf_fields])
        glob = {k: getattr(state, k) for k in _global_names(stage)}
        ctx, new_glob = stage.prepare(glob, updates if stage.needs_updates else None)
        ctxs.append(ctx)
        globals_.append(new_glob)

    groups: dict[tuple, list[int]] = {}
    for i in range(len(gs)):
        groups.setdefault(_group_key(i, gs, ps, fields_per_stage, actives), []).append(i)
    groups = _chunk(groups.values(), max_group)

    out_u = [None] * len(gs)
    out_fields = [[[None] * len(gs) for _ in s.leaf_fields] for s in stages]
    has_p = params is not None
    for idx in groups:
        i0 = idx[0]
        act = [actives[k][i0] for k in range(len(stages))]
        fn = _leaf_fn(stages, act, ctxs, has_p)
        small = max_leaf_size is None or gs[i0].size <= max_leaf_size
        if len(idx) < min_group or not small:
            for i in idx:
                u, nf = fn(gs[i], ps[i], tuple(tuple(f[i] for f in fields)
                                                for fields in fields_per_stage))
                _scatter(out_u, out_fields, [i], u, nf, stacked=False)
            continue
        G = _stack([gs[i] for i in idx], materialize)
        P = _stack([ps[i] for i in idx], materialize) if has_p else None
        F = tuple(tuple(f[i0] if not hasattr(f[i0], "shape") else
                        _stack([f[i] for i in idx], materialize) for f in fields)
                  for fields in fields_per_stage)
        U, NF = jax.vmap(fn)(G, P, F)
        _scatter(out_u, out_fields, idx, U, NF, stacked=True)

    new_states = []
    for k, (stage, state) in enumerate(zip(stages, states)):
        if stage.state_cls is None:
            new_states.append(state)
            continue
        values = dict(globals_[k])
        for nm, lst in zip(stage.leaf_fields, out_fields[k]):
            values[nm] = treedef.unflatten(lst)
        new_states.append(stage.state_cls(**values))
    return treedef.unflatten(out_u), new_states


def _chunk(groups, max_group: int) -> list[list[int]]:
    """Split groups into chunks of at most ``max_group`` leaves (0: no limit).

    XLA:CPU compiles k slices of one array in O(k^2) time (1000 slices: 35 s;
    16 slices x 64 arrays: 1.5 s), so unstacking needs small groups.
    """
    out = []
    for idx in groups:
        step = max_group or len(idx)
        out += [idx[i:i + step] for i in range(0, len(idx), step)]
    return out


def _scatter(out_u, out_fields, idx, U, NF, stacked):
    for j, i in enumerate(idx):
        out_u[i] = U[j] if stacked else U
        for k, fields in enumerate(NF):
            for f, v in enumerate(fields):
                if not hasattr(v, "shape") or (stacked and v.ndim == 0):
                    out_fields[k][f][i] = v  # masked placeholder
                else:
                    out_fields[k][f][i] = v[j] if stacked else v


def grouped(tx: Any, **kw: Any) -> functrain.GradientTransformation:
    """A functrain chain of stages whose update runs through :func:`grouped_block`."""
    plan = getattr(tx.update, PLAN_ATTR)
    if not all(isinstance(s, LeafStage) and not s.needs_updates for _, s in plan):
        raise ValueError("prototype: only chains of plain leaf stages")

    def get(state, path):
        for k in path:
            state = state[k]
        return state

    def rebuild(state, prefix, results):
        if prefix in results:
            return results[prefix]
        return tuple(rebuild(s, prefix + (k,), results) for k, s in enumerate(state))

    def update(updates, state, params=None, **extra):
        new_u, new = grouped_block([s for _, s in plan], updates,
                                   [get(state, p) for p, _ in plan], params, **kw)
        return new_u, rebuild(state, (), {p: s for (p, _), s in zip(plan, new)})

    return functrain.GradientTransformation(tx.init, update)


# --------------------------------------------------------------------------
# Stacked state: the state holds one [k, *shape] array per group
# --------------------------------------------------------------------------

def grouped_stacked(tx: Any, materialize: bool = False, max_group: int = 0,
                    max_leaf_size: Optional[int] = None) -> functrain.GradientTransformation:
    """Like :func:`grouped`, with each group's state stored stacked.

    The state is ``(groups, per-stage globals)``; ``groups`` maps a group id to
    a tuple (per stage) of tuples (per field) of stacked arrays. Params and
    grads are stacked every step; the updates are unstacked.
    """
    plan = getattr(tx.update, PLAN_ATTR)
    stages = [s for _, s in plan]
    if not all(isinstance(s, LeafStage) and not s.needs_updates and s.mask in (None, True)
               for s in stages):
        raise ValueError("prototype: only unmasked chains of plain leaf stages")

    def layout(params):
        ps, treedef = jax.tree_util.tree_flatten(params)
        groups: dict[tuple, list[int]] = {}
        for i, p in enumerate(ps):
            big = max_leaf_size is not None and p.size > max_leaf_size
            groups.setdefault((i,) if big else (p.shape, p.dtype), []).append(i)
        return ps, treedef, _chunk(groups.values(), max_group)

    def init(params):
        ps, _, groups = layout(params)
        per_group = []
        for idx in groups:
            stacked = jnp.stack([ps[i] for i in idx])
            per_group.append(tuple(tuple(stage.init_leaf(stacked)) for stage in stages))
        return (per_group, [dict(stage.init_global()) for stage in stages])

    def update(updates, state, params=None, **extra):
        per_group, glob = state
        gs, treedef = jax.tree_util.tree_flatten(updates)
        ps = treedef.flatten_up_to(params)
        _, _, groups = layout(params)
        ctxs, new_glob = [], []
        for stage, g in zip(stages, glob):
            ctx, ng = stage.prepare(g, None)
            ctxs.append(ctx)
            new_glob.append(ng)
        fn = _leaf_fn(stages, [True] * len(stages), ctxs, True)
        out_u = [None] * len(gs)
        new_groups = []
        for idx, F in zip(groups, per_group):
            if len(idx) == 1:
                i = idx[0]
                u, NF = jax.vmap(fn)(gs[i][None], ps[i][None], F)
                out_u[i] = u[0]
            else:
                U, NF = jax.vmap(fn)(_stack([gs[i] for i in idx], materialize),
                                     _stack([ps[i] for i in idx], materialize), F)
                for j, i in enumerate(idx):
                    out_u[i] = U[j]
            new_groups.append(NF)
        return treedef.unflatten(out_u), (new_groups, new_glob)

    return functrain.GradientTransformation(init, update)


# --------------------------------------------------------------------------
# Trust ratio with one scalar kernel per leaf
# --------------------------------------------------------------------------

# P1 was adopted: functrain's own ``trust_ratio`` now tests zero on the squared
# norms (one scalar kernel per leaf). The ``tr`` variant therefore measures the
# same math as plain functrain; it is kept so old command lines still run.
from functrain.transforms.scaling import trust_ratio as trust_ratio_one_kernel  # noqa: E402


class ScratchState(NamedTuple):
    """State of the scratch trust-ratio stage: a params-shaped buffer."""

    scratch: Any


def with_scratch_trust_ratio(tx: Any) -> functrain.GradientTransformation:
    """The same chain, with the trust-ratio stage keeping a params-shaped
    scratch buffer in its state and writing the update direction into it.

    The direction ``u`` has two consumers (its norm and the final scaling), so
    XLA materializes it; as a fresh temporary it is a new allocation every
    step (for a 64 MB leaf glibc serves it with mmap, and the page faults cost
    about as much as two passes over the array). As a donated state output it
    lands in the same buffer every step.
    """
    import dataclasses  # noqa: PLC0415

    plan = getattr(tx.update, PLAN_ATTR)
    new_stages = []
    for _, s in plan:
        if s.name == "scale_by_trust_ratio":
            inner = s.update_leaf

            def leaf(g, st, p, ctx, inner=inner):
                u, _ = inner(g, (), p, ctx)
                return u, (g,)
            s = dataclasses.replace(s, update_leaf=leaf, state_cls=ScratchState,
                                    leaf_fields=("scratch",),
                                    init_leaf=lambda p: (ft.zeros_like(p),))
        new_stages.append(functrain.stage_transform(s))
    return functrain.chain(*new_stages)


def with_one_kernel_trust_ratio(tx: Any) -> functrain.GradientTransformation:
    """The same chain with ``scale_by_trust_ratio``'s leaf math swapped for
    :func:`trust_ratio_one_kernel` (hyperparameters read from the original's
    closure: trust_coefficient, eps, min_norm, max_trust_ratio)."""
    import dataclasses  # noqa: PLC0415

    plan = getattr(tx.update, PLAN_ATTR)
    new_stages = []
    for _, s in plan:
        if s.name == "scale_by_trust_ratio":
            cl = dict(zip(s.update_leaf.__code__.co_freevars,
                          (c.cell_contents for c in s.update_leaf.__closure__)))
            kw = {k: cl[k] for k in ("trust_coefficient", "eps", "min_norm", "max_trust_ratio")}

            def leaf(g, st, p, ctx, kw=kw):
                return g * trust_ratio_one_kernel(p, g, **kw), ()
            s = dataclasses.replace(s, update_leaf=leaf)
        new_stages.append(functrain.stage_transform(s))
    return functrain.chain(*new_stages)


# --------------------------------------------------------------------------
# Libraries for benchmarks/run.py
# --------------------------------------------------------------------------

def lib(name: str) -> dict:
    """A ``--libs`` entry of run.py for prototype ``name``.

    ``name`` is ``proto-`` and dash-separated features: ``tr`` (one-kernel
    trust ratio), ``group`` (grouped, per-leaf state) or ``stacked`` (grouped,
    stacked state), ``max<K>`` (at most K leaves a group), ``small<N>`` (group
    only leaves of at most N elements, e.g. ``small64k``), ``copy``
    (materialize the stacks). E.g. ``proto-tr-stacked-max16-small64k``.
    """
    import run  # noqa: PLC0415 (benchmarks/run.py, on sys.path when it imports us)

    feats = name.split("-")[1:]
    if not feats or feats[0] == "":
        raise ValueError(f"unknown prototype {name!r}")
    tr = "tr" in feats
    scratch = "scratch" in feats
    kw: dict = {}
    mode = None
    for f in feats:
        if f in ("group", "stacked"):
            mode = f
        elif f.startswith("max"):
            kw["max_group"] = int(f[3:])
        elif f.startswith("small"):
            kw["max_leaf_size"] = run.parse_size(f[5:])
        elif f == "copy":
            kw["materialize"] = True
        elif f not in ("tr", "scratch"):
            raise ValueError(f"unknown prototype feature {f!r} in {name!r}")

    def wrap(tx):
        if tr:
            tx = with_one_kernel_trust_ratio(tx)
        if scratch:
            tx = with_scratch_trust_ratio(tx)
        if mode == "group":
            return grouped(tx, **kw)
        if mode == "stacked":
            return grouped_stacked(tx, **kw)
        return tx

    return dict(make=lambda o: wrap(run._make(functrain, o)), apply=functrain.apply_updates,
                ctx=contextlib.nullcontext)
