"""The GradientTransformation protocol, ``chain``, and the fused leaf engine.

Every functrain building block (``scale_by_adam``, ``trace``, ...) is a
:class:`LeafStage`: the per-array math of one transformation plus the small
amount of scalar bookkeeping (a step count, a schedule value) it needs. A stage
is exposed to users as an ordinary optax-style ``GradientTransformation``.

``chain`` looks inside the transformations it is given: consecutive stages are
fused into one *block*, and the engine (:func:`run_block`) walks the pytree
once for the whole block, calling each stage's leaf function in turn on the
same leaf. The chain's state keeps exactly the layout of an unfused chain (a
tuple of each transformation's state), so states, checkpoints and optax
interop look the same either way; only the schedule of the arithmetic changes.
Transformations that are not stages (optax's, user-written, wrappers) run
unfused in their place in the chain.

All checks (tree structures, shapes, required params, masks) run in the engine
before any array math, and name the offending leaf's key path.
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
import os
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

from functrain import tree as ft

PyTree = Any
Params = Any
Updates = Any
OptState = Any
ScalarOrSchedule = Any  # float | jax.Array | Callable[[jax.Array], jax.Array]

_PLAN = "_functrain_plan"


class GradientTransformation(NamedTuple):
    """An optimizer as a pair of pure functions, optax's protocol.

    ``init(params) -> state`` and
    ``update(updates, state, params=None, **extra_args) -> (updates, state)``.
    It is a plain two-field NamedTuple, so functrain and optax transformations
    compose in both libraries' ``chain``.

    >>> import jax.numpy as jnp
    >>> tx = GradientTransformation(lambda p: (), lambda u, s, p=None: (u, s))
    >>> tx.update({'w': jnp.ones(1)}, tx.init({'w': jnp.ones(1)}))[0]
    {'w': Array([1.], dtype=float32)}
    """

    init: Callable[[Params], OptState]
    update: Callable[..., tuple[Updates, OptState]]


class EmptyState(NamedTuple):
    """The state of a transformation that keeps none.

    >>> EmptyState()
    EmptyState()
    """


@dataclasses.dataclass(frozen=True)
class LeafStage:
    """The per-array math of one transformation, lifted over pytrees by the engine.

    Attributes:
      name: the public name, used in error messages.
      update_leaf: ``(g, leaf_states, p, ctx) -> (u, new_leaf_states)`` on one
        array; ``leaf_states`` is a tuple, one entry per ``leaf_fields``.
      state_cls: the state NamedTuple, or ``None`` for :class:`EmptyState`.
      leaf_fields: fields of ``state_cls`` that hold a params-shaped tree.
      init_leaf: ``p -> tuple`` of initial per-leaf states.
      init_global: ``() -> dict`` of scalar state fields (e.g. ``count``).
      prepare: ``(global_fields, updates) -> (ctx, new_global_fields)``; runs
        once per step, before the leaf pass; ``updates`` is the block's input
        tree when ``needs_updates`` else ``None``.
      needs_params: ``update`` raises unless params are given.
      needs_updates: ``prepare`` reads the whole incoming tree (e.g. a global
        norm); such a stage starts a new fused block.
      mask: ``None``, a tree (or prefix) of bools, or a function of params:
        leaves where it is False pass through and hold no state.
      shaped_fields: the ``leaf_fields`` whose per-leaf state has the
        parameter's shape (the engine checks those shapes); ``None`` means all
        of them. Stages with reduced per-leaf state (Adafactor's factored
        moments, SM3's per-dimension accumulators) list only the others.
      norm_of_input: ``update_leaf`` reduces its input (e.g. takes its norm)
        and then also uses the input itself, like a trust ratio. When earlier
        stages of the same fused block produced that input, the engine may
        call ``update_leaf(..., x_for_norm=y)`` with ``y`` an equal value
        computed separately, so the compiler can fuse the reduction with the
        input's producers instead of storing the input in a temporary buffer
        (see :func:`run_block`). The stage must take its reductions from
        ``x_for_norm`` when given, and everything else from its input.

    >>> import jax.numpy as jnp
    >>> double = stage_transform(LeafStage('double', lambda g, s, p, c: (2 * g, ())))
    >>> double.update({'w': jnp.ones(1)}, double.init({'w': jnp.ones(1)}))[0]
    {'w': Array([2.], dtype=float32)}
    """

    name: str
    update_leaf: Callable[..., tuple[Any, tuple]]
    state_cls: Optional[type] = None
    leaf_fields: tuple[str, ...] = ()
    init_leaf: Callable[[Any], tuple] = lambda p: ()
    init_global: Callable[[], dict] = dict
    prepare: Callable[[dict, Any], tuple[Any, dict]] = lambda g, u: (None, g)
    needs_params: bool = False
    needs_updates: bool = False
    mask: Any = None
    shaped_fields: Optional[tuple[str, ...]] = None
    norm_of_input: bool = False

    def init_state(self, params: Params) -> OptState:
        """The stage's state for ``params`` (checks the mask fits them, too)."""
        active = ft.resolve_leaf_mask(self.mask, params, self.name)
        if self.state_cls is None:
            return EmptyState()
        paths, leaves, treedef = ft.flatten_with_paths(params)
        per_field: list[list[Any]] = [[] for _ in self.leaf_fields]
        for p, on in zip(leaves, active):
            values = self.init_leaf(p) if on else (ft.MaskedNode(),) * len(self.leaf_fields)
            for lst, v in zip(per_field, values):
                lst.append(v)
        fields = dict(self.init_global())
        for name, lst in zip(self.leaf_fields, per_field):
            fields[name] = treedef.unflatten(lst)
        return self.state_cls(**fields)


def safe_increment(count: jax.Array) -> jax.Array:
    """``count + 1``, saturating at the dtype's maximum instead of wrapping.

    >>> import jax.numpy as jnp
    >>> safe_increment(jnp.asarray(2**31 - 1, jnp.int32))
    Array(2147483647, dtype=int32)
    """
    count = jnp.asarray(count)
    if jnp.issubdtype(count.dtype, jnp.integer):
        top = jnp.iinfo(count.dtype).max
        return jnp.where(count < top, count + 1, top).astype(count.dtype)
    return count + 1


def zero_count() -> dict:
    """``{'count': int32 0}``: the global state of stages that count steps."""
    return {"count": jnp.zeros([], jnp.int32)}


# --------------------------------------------------------------------------
# The engine: one walk over the tree for a block of fused stages
# --------------------------------------------------------------------------

def run_block(stages: Sequence[LeafStage], updates: Updates, states: Sequence[OptState],
              params: Optional[Params]) -> tuple[Updates, list[OptState]]:
    """Apply ``stages`` in sequence to every leaf in one pass over the tree.

    Checks the structures and shapes of updates, params and every state against
    each other first, so errors name the offending key path before any math.
    """
    paths, gs, treedef = ft.flatten_with_paths(updates)
    if params is not None:
        ft.check_structure(updates, params, "params", "updates")
        ps = treedef.flatten_up_to(params)
        ft.check_shapes(paths, ps, gs, "updates", "params")
    else:
        needing = [s.name for s in stages if s.needs_params]
        if needing:
            raise ValueError(
                f"{needing[0]} needs the current parameters: call "
                f"update(updates, state, params) with params (they are required).")
        ps = [None] * len(gs)
    mask_source = params if params is not None else updates

    plans = []  # per stage: (active flags, per-field leaf lists, ctx, global fields)
    for stage, state in zip(stages, states):
        if stage.state_cls is not None and not isinstance(state, stage.state_cls):
            raise TypeError(f"{stage.name} expected its state as {stage.state_cls.__name__}, "
                            f"got {type(state).__name__}: was the state made by this "
                            f"optimizer's init?")
        active = ft.resolve_leaf_mask(stage.mask, mask_source, stage.name)
        fields = []
        for name in stage.leaf_fields:
            leaves = ft.flatten_like(treedef, getattr(state, name),
                                     f"{stage.name} state .{name}", updates, "updates")
            if stage.shaped_fields is None or name in stage.shaped_fields:
                ft.check_shapes(paths, leaves, gs, "updates", f"{stage.name} state .{name}")
            fields.append(leaves)
        global_fields = {k: getattr(state, k) for k in _global_names(stage)}
        ctx, new_global = stage.prepare(global_fields, updates if stage.needs_updates else None)
        plans.append((active, fields, ctx, new_global))

    out_updates = []
    new_fields = [[[] for _ in s.leaf_fields] for s in stages]
    recompute = recompute_enabled() and _recompute_pays(stages, plans, gs, ps)
    jaxprs: dict = {}  # prefix jaxprs, shared by leaves of one shape (this trace only)
    for i, (g, p) in enumerate(zip(gs, ps)):
        cd = _leaf_compute_dtype(g, p)
        x = g.astype(cd)
        x0 = x
        pc = None if p is None else p.astype(cd)
        ran: list = []  # per stage: None (masked) or (olds in compute dtype, new states)
        for k, stage in enumerate(stages):
            active, fields, ctx, _ = plans[k]
            olds = tuple(f[i] for f in fields)
            if not active[i]:
                news = olds
                ran.append(None)
            else:
                olds_c = tuple(o.astype(_compute(o, cd)) for o in olds)
                extra = {}
                if stage.norm_of_input and recompute and any(r is not None for r in ran):
                    y = _input_for_norm(stages[:k], [pl[2] for pl in plans[:k]], ran, x0, pc,
                                        jaxprs)
                    if y is not None:
                        extra["x_for_norm"] = y
                x, news = stage.update_leaf(x, olds_c, pc, ctx, **extra)
                ran.append((olds_c, news))
                news = tuple(n.astype(o.dtype) for n, o in zip(news, olds))
            for lst, n in zip(new_fields[k], news):
                lst.append(n)
        out_updates.append(x.astype(g.dtype))

    new_states = []
    for stage, state, (_, _, _, new_global), fields in zip(stages, states, plans, new_fields):
        if stage.state_cls is None:
            new_states.append(state)
            continue
        values = dict(new_global)
        for name, lst in zip(stage.leaf_fields, fields):
            values[name] = treedef.unflatten(lst)
        new_states.append(stage.state_cls(**values))
    return treedef.unflatten(out_updates), new_states


# Recompute a trust ratio's input only when the temporaries it saves would be
# big: measured on XLA:CPU (2-core AMD EPYC, jax 0.10.2), storing LAMB's
# direction costs a page-faulting fresh allocation per step once the block's
# temporaries pass glibc's 32 MiB mmap threshold (16M params: 50 -> 35 ms),
# while below it the recomputing reduction is the slower kernel (2M: 3.7 ->
# 4.5 ms). Tests set it to 0 to exercise the recompute on small trees.
RECOMPUTE_MIN_BYTES = 32 * 2**20


def _recompute_pays(stages: Sequence[LeafStage], plans: list, gs: list, ps: list) -> bool:
    """Whether the temporaries a recompute would save reach RECOMPUTE_MIN_BYTES."""
    total = 0
    for k, stage in enumerate(stages):
        if not stage.norm_of_input or k == 0:
            continue
        for i, g in enumerate(gs):
            if plans[k][0][i] and any(plans[j][0][i] for j in range(k)):
                cd = _leaf_compute_dtype(g, ps[i])
                total += int(np.prod(g.shape)) * jnp.dtype(cd).itemsize
    return total >= RECOMPUTE_MIN_BYTES


def _input_for_norm(prefix: Sequence[LeafStage], ctxs: Sequence[Any], ran: list,
                    x0: jax.Array, pc: Any, cache: dict) -> Optional[jax.Array]:
    """The input of a ``norm_of_input`` stage, computed a second time for its norm.

    A trust ratio needs the norm of its input ``u`` (e.g. LAMB's Adam direction)
    before it can scale ``u``. If ``u`` has these two consumers, XLA computes
    it once and stores it: a params-sized temporary per leaf, allocated every
    step (on CPU, glibc serves blocks over 32 MB with ``mmap``, so every step
    page-faults through it). Here the prefix stages are re-evaluated from
    their jaxpr with their float literals (``eps``, the weight decay, ...)
    passed through ``optimization_barrier``: the copy is no longer identical
    to ``u``, so XLA neither merges the two nor materializes ``u``, and the
    norm's reduction fuses with the arithmetic that produces it (constants
    left inline would be materialized as broadcast arrays by XLA:CPU's
    reduction fusions). The new optimizer states are not recomputed: the
    copy reads the ones already computed. Every operation is the same as in
    ``u`` with the same values; only the order in which XLA sums the norm may
    differ (float32 rounding: 3e-7 relative in the tests).
    Returns ``None`` when there is nothing to make opaque.
    """
    olds = [None if r is None else r[0] for r in ran]

    def prefix_fn(x: jax.Array, olds: list, p: Any) -> tuple:
        news = []
        for stage, ctx, o in zip(prefix, ctxs, olds):
            if o is not None:
                x, n = stage.update_leaf(x, o, p, ctx)
                news.append(n)
        return x, news

    args = jax.tree_util.tree_leaves((x0, olds, pc))
    sig = (len(prefix), tuple(r is None for r in ran), tuple((a.shape, a.dtype) for a in args))
    if sig not in cache:
        cache[sig] = _opaque_prefix(jax.make_jaxpr(prefix_fn)(x0, olds, pc))
    if cache[sig] is None:
        return None
    jaxpr, consts, opaque = cache[sig]

    env: dict = {}
    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    known = {}  # the prefix's state outputs -> the values computed in the main pass
    news_real = jax.tree_util.tree_leaves([r[1] for r in ran if r is not None])
    known.update((v, n) for v, n in zip(jaxpr.outvars[1:], news_real) if not _is_literal(v))

    def read(v: Any) -> Any:
        if _is_literal(v):
            return opaque.get(_opaque_key(v), v.val)
        return env[v]

    for eqn in jaxpr.eqns:
        if eqn.outvars and all(v in known for v in eqn.outvars):
            env.update((v, known[v]) for v in eqn.outvars)
            continue
        params = eqn.primitive.get_bind_params(eqn.params)
        subfuns: Any = ()
        if isinstance(params, tuple):  # older JAX: (subfuns, params)
            subfuns, params = params
        outs = eqn.primitive.bind(*subfuns, *[read(v) for v in eqn.invars], **params)
        if not eqn.primitive.multiple_results:
            outs = [outs]
        for v, o in zip(eqn.outvars, outs):
            env[v] = known.get(v, o)
    return read(jaxpr.outvars[0])


def _opaque_prefix(closed: Any) -> Optional[tuple]:
    """``(jaxpr, consts, opaque literals)`` with scalar floats behind a barrier, or None.

    Computed once per jaxpr and shared by every leaf that uses it.
    """
    jaxpr = closed.jaxpr
    literals = {}
    for eqn in jaxpr.eqns:
        for v in eqn.invars:
            key = _opaque_key(v)
            if key is not None:
                literals.setdefault(key, v.aval.dtype)
    scalar_consts = [i for i, v in enumerate(jaxpr.constvars)
                     if v.aval.shape == () and jnp.issubdtype(v.aval.dtype, jnp.floating)]
    if not literals and not scalar_consts:
        return None
    consts = list(closed.consts)
    hidden = jax.lax.optimization_barrier((
        tuple(np.asarray(val, dt) for (val, _), dt in literals.items()),
        tuple(consts[i] for i in scalar_consts)))
    for i, c in zip(scalar_consts, hidden[1]):
        consts[i] = c
    return jaxpr, consts, dict(zip(literals, hidden[0]))


def _is_literal(v: Any) -> bool:
    return isinstance(v, jex_core.Literal)


def _opaque_key(v: Any) -> Optional[tuple]:
    """``(value, dtype)`` of a scalar float literal (one the recompute hides), else None."""
    if (_is_literal(v) and np.shape(v.val) == ()
            and jnp.issubdtype(v.aval.dtype, jnp.floating)):
        return float(v.val), str(v.aval.dtype)
    return None


def _leaf_compute_dtype(g: jax.Array, p: Optional[jax.Array]) -> Any:
    """The dtype one leaf's math runs in: grads promoted with params, 16-bit as float32."""
    return ft.compute_dtype(g.dtype if p is None else jnp.promote_types(g.dtype, p.dtype))


def _compute(x: jax.Array, cd: Any) -> Any:
    """Compute dtype for a state leaf: at least the leaf math's dtype."""
    if jnp.issubdtype(x.dtype, jnp.floating):
        return jnp.promote_types(ft.compute_dtype(x.dtype), cd)
    return x.dtype


def _global_names(stage: LeafStage) -> list[str]:
    if stage.state_cls is None:
        return []
    return [f for f in stage.state_cls._fields if f not in stage.leaf_fields]


def stage_transform(stage: LeafStage) -> GradientTransformation:
    """A ``GradientTransformation`` running one stage; ``chain`` can fuse it.

    >>> import jax.numpy as jnp
    >>> neg = stage_transform(LeafStage('neg', lambda g, s, p, c: (-g, ())))
    >>> neg.update([jnp.ones(2)], neg.init([jnp.ones(2)]))[0]
    [Array([-1., -1.], dtype=float32)]
    """
    def init_fn(params: Params) -> OptState:
        return stage.init_state(params)

    def update_fn(updates: Updates, state: OptState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, OptState]:
        del extra_args
        new_updates, (new_state,) = run_block((stage,), updates, (state,), params)
        return new_updates, new_state

    setattr(update_fn, _PLAN, (((), stage),))
    return GradientTransformation(init_fn, update_fn)


# --------------------------------------------------------------------------
# Combinators
# --------------------------------------------------------------------------

def _accepts_extra_args(fn: Callable) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _call_update(tx: Any, updates: Updates, state: OptState, params: Optional[Params],
                 extra_args: dict) -> tuple[Updates, OptState]:
    if extra_args and _accepts_extra_args(tx.update):
        return tx.update(updates, state, params, **extra_args)
    return tx.update(updates, state, params)


def _plan_of(tx: Any) -> tuple:
    plan = getattr(getattr(tx, "update", None), _PLAN, None)
    return plan if plan is not None else (((), tx),)


_OFF = ("0", "false", "off", "no")
_ENGINE_OPTIMIZATIONS = ("fuse", "recompute")


def _engine_opts() -> frozenset:
    value = os.environ.get("FUNCTRAIN_ENGINE_OPT", "1").strip().lower()
    if value in _OFF:
        return frozenset()
    if value in ("", "1", "true", "on", "yes", "all"):
        return frozenset(_ENGINE_OPTIMIZATIONS)
    chosen = frozenset(v.strip() for v in value.split(",") if v.strip())
    unknown = sorted(chosen - set(_ENGINE_OPTIMIZATIONS))
    if unknown:
        raise ValueError(f"FUNCTRAIN_ENGINE_OPT={value!r}: unknown optimization(s) {unknown}; "
                         f"use 1 (all), 0 (none) or a comma-separated subset of "
                         f"{list(_ENGINE_OPTIMIZATIONS)}")
    return chosen


def fusion_enabled() -> bool:
    """Whether ``chain`` fuses consecutive stages (read when a step is traced).

    Set the environment variable ``FUNCTRAIN_ENGINE_OPT=0`` to turn the
    engine's optimizations off (one walk over the tree per transformation, as
    optax does), e.g. to compare speed; the numbers are the same either way.
    ``FUNCTRAIN_ENGINE_OPT=fuse`` keeps fusion but not the trust-ratio
    recompute (see :func:`recompute_enabled`); the default is all of them.

    >>> fusion_enabled()
    True
    """
    return "fuse" in _engine_opts()


def recompute_enabled() -> bool:
    """Whether fused trust ratios take their norm from a recomputed input.

    See ``LeafStage.norm_of_input``: the engine recomputes the update
    direction for the norm instead of storing it in a params-sized temporary.
    It needs fusion (the direction must come from the same block); set
    ``FUNCTRAIN_ENGINE_OPT=fuse`` (fusion only) or ``0`` (nothing) to turn it
    off. The numbers agree either way up to float32 rounding (XLA may sum the
    norm in another order).

    >>> recompute_enabled()
    True
    """
    return {"fuse", "recompute"} <= _engine_opts()


def chain(*transforms: Any) -> GradientTransformation:
    """Apply transformations in sequence; consecutive functrain stages are fused.

    Accepts functrain and optax transformations alike (anything with ``init``
    and ``update``). The state is a tuple of each transformation's state.

    >>> import jax.numpy as jnp
    >>> import functrain
    >>> tx = functrain.chain(functrain.clip(1.0), functrain.scale(-0.1))
    >>> params = {'w': jnp.array([3., -0.5])}
    >>> updates, state = tx.update(params, tx.init(params))
    >>> updates
    {'w': Array([-0.1 ,  0.05], dtype=float32)}
    """
    for i, tx in enumerate(transforms):
        if not (callable(getattr(tx, "init", None)) and callable(getattr(tx, "update", None))):
            raise TypeError(f"chain argument {i} is a {type(tx).__name__}, not a "
                            f"GradientTransformation (an object with init and update).")
    plan = tuple(((i,) + path, item) for i, tx in enumerate(transforms)
                 for path, item in _plan_of(tx))

    def init_fn(params: Params) -> OptState:
        return tuple(tx.init(params) for tx in transforms)

    def update_fn(updates: Updates, state: OptState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, OptState]:
        if not isinstance(state, tuple) or len(state) != len(transforms):
            raise ValueError(f"chain of {len(transforms)} transformations got a state of "
                             f"type {type(state).__name__} with "
                             f"{len(state) if isinstance(state, tuple) else '?'} entries: "
                             f"was it made by this chain's init?")
        results: dict[tuple, OptState] = {}
        fuse = fusion_enabled()
        i = 0
        while i < len(plan):
            path, item = plan[i]
            if not isinstance(item, LeafStage):
                updates, results[path] = _call_update(
                    item, updates, _get(state, path), params, extra_args)
                i += 1
                continue
            j = i + 1
            while (fuse and j < len(plan) and isinstance(plan[j][1], LeafStage)
                   and not plan[j][1].needs_updates):
                j += 1
            block = plan[i:j]
            updates, new = run_block([s for _, s in block], updates,
                                     [_get(state, p) for p, _ in block], params)
            results.update({p: s for (p, _), s in zip(block, new)})
            i = j
        return updates, _rebuild(state, (), results)

    setattr(update_fn, _PLAN, plan)
    return GradientTransformation(init_fn, update_fn)


def _get(state: OptState, path: tuple) -> OptState:
    for k in path:
        state = state[k]
    return state


def _rebuild(state: OptState, prefix: tuple, results: dict) -> OptState:
    if prefix in results:
        return results[prefix]
    return tuple(_rebuild(s, prefix + (k,), results) for k, s in enumerate(state))


def identity() -> GradientTransformation:
    """The transformation that leaves updates unchanged and keeps no state.

    >>> import jax.numpy as jnp
    >>> tx = identity()
    >>> tx.update([jnp.ones(1)], tx.init([jnp.ones(1)]))
    ([Array([1.], dtype=float32)], EmptyState())
    """
    return stage_transform(LeafStage("identity", lambda g, s, p, c: (g, ())))


def apply_updates(params: Params, updates: Updates) -> Params:
    """``params + updates`` leaf by leaf, keeping each parameter's dtype.

    >>> import jax.numpy as jnp
    >>> apply_updates({'w': jnp.array([1., 2.])}, {'w': jnp.array([0.5, -1.])})
    {'w': Array([1.5, 1. ], dtype=float32)}
    """
    ft.check_structure(params, updates, "updates", "params")
    paths, ps, treedef = ft.flatten_with_paths(params)
    us = treedef.flatten_up_to(updates)
    ft.check_shapes(paths, ps, us, "updates", "params")
    return treedef.unflatten(
        [None if p is None else (jnp.asarray(p) + u).astype(jnp.asarray(p).dtype)
         for p, u in zip(ps, us)])


def global_norm(updates: Updates) -> jax.Array:
    """The L2 norm of all leaves together (as optax.global_norm).

    >>> import jax.numpy as jnp
    >>> global_norm({'a': jnp.array([3.]), 'b': jnp.array([4.])})
    Array(5., dtype=float32)
    """
    return ft.norm(updates)


# --------------------------------------------------------------------------
# Hyperparameter validation (concrete values only; traced values pass)
# --------------------------------------------------------------------------

def _concrete(value: Any) -> Optional[float]:
    if isinstance(value, jax.core.Tracer) or callable(value):
        return None
    if isinstance(value, numbers.Number) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, (np.ndarray, jax.Array, np.generic)) and np.ndim(value) == 0:
        try:
            return float(value)
        except (TypeError, jax.errors.ConcretizationTypeError):
            return None
    return None


def check_range(name: str, value: Any, low: float, high: Optional[float] = None, *,
                high_inclusive: bool = False, owner: str = "") -> None:
    """Raise ``ValueError`` naming ``name`` if a concrete ``value`` is out of range.

    The range is ``[low, high)`` (or ``[low, high]`` with ``high_inclusive``);
    traced values and schedules are not checked.

    >>> check_range('b1', 1.5, 0.0, 1.0, owner='adam')
    Traceback (most recent call last):
    ...
    ValueError: adam: b1 must be in [0.0, 1.0), got 1.5.
    """
    v = _concrete(value)
    if v is None:
        return
    bad = v != v or v < low or (high is not None and (v > high if high_inclusive else v >= high))
    if bad:
        where = f"{owner}: " if owner else ""
        if high is None:
            raise ValueError(f"{where}{name} must be >= {low}, got {value}.")
        close = "]" if high_inclusive else ")"
        raise ValueError(f"{where}{name} must be in [{low}, {high}{close}, got {value}.")
