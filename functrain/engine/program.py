"""The engine: one walk over the tree for a block of stages, and ``chain``.

:func:`run_block` lifts :class:`~functrain.engine.stage.LeafStage` s over
pytrees. Before any array math it checks tree structures, shapes, required
params and masks, naming the offending key path. Then, leaf by leaf, it runs
every stage of the block in turn: 16-bit leaves are computed in float32 and
cast back, masked-out leaves pass through and hold no state
(:class:`~functrain.tree.MaskedNode`).

``chain`` looks inside the transformations it is given: consecutive stages
(also those of nested chains) are fused into one block, so ``lamb`` walks the
tree once per step. The chain's state keeps exactly the layout of an unfused
chain (a tuple of each transformation's state), so states, checkpoints and
optax interop look the same either way. Transformations that are not stages
(optax's, user-written, wrappers) run unfused in their place in the chain.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp

from functrain.arg_checks import (check_state_type, check_transformation, missing_argument_error,
                                  needs_params_error, sorted_labels, state_mismatch_error)
from functrain.declarations import record_parts
from functrain import tree as ft
from functrain.engine import recompute
from functrain.engine.dtypes import (integer_float, integers_as_floats, leaf_compute_dtype,
                                     state_compute_dtype)
from functrain.engine.protocol import (GradientTransformation, GradientTransformationExtraArgs,
                                       MaskedState, OptState, Params, Updates)
from functrain.engine.stage import LeafChecks, LeafStage, as_array
from functrain.engine.state_io import PLAIN_STATE, StateIO


class Program:
    """A transformation's definition, and its ``update``: steps run by :func:`run_plan`.

    ``stage_transform``, ``chain`` and the wrappers built on them (``masked``,
    ``quantized_state``, ...) return transformations whose ``update`` is a ``Program``:
    calling it runs its steps, so the steps are the only definition of what it does, and an
    enclosing ``chain`` reads them (:func:`fusion_plan`) to fuse consecutive stages.

    Args:
      steps: ``((state path, LeafStage or transformation), ...)``: the state path says
        where each step's state lives inside the program's state.
      io: how per-leaf state is read and written (:class:`~functrain.engine.state_io.StateIO`;
        as it is by default). A program with other I/O is opaque to an enclosing ``chain``.
      guards: functions ``guard(run, updates, state, params, extra_args) -> (updates,
        state)`` around the run, innermost first (a state check, ``None`` updates, a state
        of optax's class read as functrain's). They apply when this program is called, not
        when a ``chain`` fuses its steps into its own.

    >>> import jax.numpy as jnp
    >>> tx = chain(identity(), identity())
    >>> isinstance(tx.update, Program), [path for path, _ in tx.update.steps]
    (True, [(0,), (1,)])
    """

    def __init__(self, steps: tuple, io: StateIO = PLAIN_STATE, guards: tuple = ()) -> None:
        self.steps = tuple(steps)
        self.io = io
        self.guards = tuple(guards)

    def __call__(self, updates: Updates, state: OptState, params: Optional[Params] = None,
                 **extra_args: Any) -> tuple[Updates, OptState]:
        run = functools.partial(run_plan, self.steps, io=self.io)
        for guard in self.guards:
            run = functools.partial(guard, run)
        return run(updates, state, params, extra_args)

    def __repr__(self) -> str:
        return f"Program({len(self.steps)} steps)"


def _flatten_program(program: Program) -> tuple[tuple, tuple]:
    paths = tuple(path for path, _ in program.steps)
    return (tuple(item for _, item in program.steps), program.guards), (paths, program.io)


def _unflatten_program(static: tuple, children: tuple) -> Program:
    (paths, io), (items, guards) = static, children
    return Program(tuple(zip(paths, items)), io, guards)


# A program is a pytree of its steps and guards (see protocol's stages).
jax.tree_util.register_pytree_node(Program, _flatten_program, _unflatten_program)


def with_guard(program: Program, guard: Any) -> Program:
    """``program`` with one more guard around its run (its steps unchanged, still fusible).

    Args:
      program: a transformation's ``update`` made by this module.
      guard: ``guard(run, updates, state, params, extra_args) -> (updates, state)``.

    Returns:
      A new :class:`Program`; ``program`` itself is not changed.

    >>> import jax.numpy as jnp
    >>> tx = identity()
    >>> twice = with_guard(tx.update, lambda run, u, s, p, e: run(2 * u, s, p, e))
    >>> twice(jnp.ones(1), tx.init(jnp.ones(1)))[0]
    Array([2.], dtype=float32)
    """
    return Program(program.steps, program.io, program.guards + (guard,))


class _BlockInputs(NamedTuple):
    """A block's flattened, checked inputs: one entry per leaf (compute dtypes included)."""
    paths: list
    gs: list
    ps: list
    treedef: Any
    compute_dtypes: list
    out_dtypes: list  # the updates' dtypes: the input's, or the float an integer leaf takes


class _StageStep(NamedTuple):
    """One stage's part of this step: where it is active, its per-leaf state, its context."""
    active: list
    fields: list  # per leaf field: the leaves, in tree order
    ctx: Any
    new_global: dict
    folds: list  # per leaf field: None, or how it folds masked-out subtrees (see _unfold)


def run_block(stages: Sequence[LeafStage], updates: Updates, states: Sequence[OptState],
              params: Optional[Params], extra_args: Optional[dict] = None,
              io: StateIO = PLAIN_STATE) -> tuple[Updates, list[OptState]]:
    """Apply ``stages`` in sequence to every leaf in one pass over the tree.

    Three phases: check the trees and flatten them (:func:`_check_inputs`); check each
    stage's state and run its ``prepare`` (:func:`_prepare_stage`); then the per-leaf pass
    (:func:`_leaf_pass`), which reads and writes each leaf's state through ``io``.

    Args:
      stages: the stages of the block, in order.
      updates: the incoming updates tree.
      states: one state per stage, as made by its ``init_state``.
      params: the parameters, or ``None``.
      extra_args: ``update``'s extra keyword arguments; a stage's ``prepare``
        receives those named in its ``extra_args``.
      io: how per-leaf state is read and written (``quantized_state`` passes its codes).

    Returns:
      ``(new_updates, new_states)``.

    Raises:
      ValueError / TypeError naming the key path (or argument) at fault when
      the trees, shapes, states, masks or required arguments do not fit,
      before any array math.

    >>> import jax.numpy as jnp
    >>> from functrain.engine.stage import LeafStage
    >>> neg = LeafStage(name='neg', update_leaf=lambda g, s, p, c: (-g, ()))
    >>> run_block([neg, neg], {'w': jnp.ones(1)}, [(), ()], None)[0]
    {'w': Array([1.], dtype=float32)}
    """
    extra_args = extra_args or {}
    for stage in stages:  # first, as Python checks a call's arguments before its body runs
        missing = [k for k in stage.extra_args if k not in extra_args]
        if missing:
            raise missing_argument_error(stage.name, missing[0])
    inputs = _check_inputs(stages, updates, params)
    steps = [_prepare_stage(stage, state, inputs, updates, params, extra_args)
             for stage, state in zip(stages, states)]
    inputs = _integers_as_float(stages, steps, inputs)
    out_updates, new_fields = _leaf_pass(stages, steps, inputs, io)
    new_states = []
    for stage, state, step, fields in zip(stages, states, steps, new_fields):
        if stage.state_cls is None:
            new_states.append(state)
            continue
        values = dict(step.new_global)
        for name, lst, fold in zip(stage.leaf_fields, fields, step.folds):
            values[name] = inputs.treedef.unflatten(lst) if fold is None else fold[0].unflatten(
                [lst[x] if isinstance(x, int) else x for x in fold[1]])
        new_states.append(stage.state_cls(**values))
    return inputs.treedef.unflatten(out_updates), new_states


def _check_inputs(stages: Sequence[LeafStage], updates: Updates,
                  params: Optional[Params]) -> _BlockInputs:
    """The updates and params flattened, after checking they fit each other and the stages."""
    paths, gs, treedef = ft.flatten_with_paths(updates)
    gs = [as_array(g) for g in gs]
    if params is not None:
        ft.check_structure(updates, params, "params", "updates")
        ps = [as_array(p) for p in treedef.flatten_up_to(params)]
        ft.check_shapes(paths, ps, gs, "updates", "params")
    else:
        needing = [s.name for s in stages if s.needs_params]
        if needing:
            raise needs_params_error(needing[0])
        ps = [None] * len(gs)
    return _BlockInputs(paths, gs, ps, treedef,
                        [leaf_compute_dtype(g, p) for g, p in zip(gs, ps)],
                        [g.dtype for g in gs])


def _integers_as_float(stages: Sequence[LeafStage], steps: Sequence["_StageStep"],
                       inputs: _BlockInputs) -> _BlockInputs:
    """``inputs`` with each integer update leaf that an arithmetic stage transforms computed,
    and returned, in the float jnp's arithmetic gives it (``0.1 * g``: float32, float64 with
    x64), as optax's updates are; leaves only ``any_dtype`` stages touch keep their dtype."""
    cds, outs = list(inputs.compute_dtypes), list(inputs.out_dtypes)
    for i, (g, p) in enumerate(zip(inputs.gs, inputs.ps)):
        if integer_float(g) is not None and any(step.active[i] and not stage.any_dtype
                                                for stage, step in zip(stages, steps)):
            outs[i] = integer_float(g)
            cds[i] = leaf_compute_dtype(jax.ShapeDtypeStruct((), outs[i]), p)
    return inputs._replace(compute_dtypes=cds, out_dtypes=outs)


def _prepare_stage(stage: LeafStage, state: OptState, inputs: _BlockInputs, updates: Updates,
                   params: Optional[Params], extra_args: dict) -> _StageStep:
    """One stage's checks (state, mask, dtypes, arguments), then its ``prepare``."""
    paths, gs, ps, treedef, _, _ = inputs
    if stage.state_cls is not None:
        check_state_type(state, stage.state_cls, stage.name)
    active = ft.resolve_leaf_mask(stage.mask, params if params is not None else updates,
                                  stage.name)
    if not stage.any_dtype:
        ft.check_leaf_dtypes(paths, gs, active, stage.name, "updates",
                             real_only=stage.real_only, integers=True)
        if params is not None:
            ft.check_leaf_dtypes(paths, ps, active, stage.name, "params",
                                 real_only=stage.real_only, integers=True)
    fields, folds = [], []
    for name in stage.leaf_fields:
        where = f"{stage.name} state .{name}"
        fold = None
        try:
            leaves = treedef.flatten_up_to(getattr(state, name))
        except (ValueError, TypeError):
            fold = _unfold(treedef, getattr(state, name))
            if fold is None:
                leaves = ft.flatten_like(treedef, getattr(state, name), where, updates,
                                         "updates")  # raises, naming the paths
            leaves = fold[2]
            for path, on, leaf in zip(paths, active, leaves):
                if on and ft.is_placeholder(leaf):
                    raise ValueError(f"{where} holds no state (MaskedNode) at {path}, where "
                                     f"the mask of {stage.name} is True: was the state made "
                                     f"by init with the same mask?")
        folds.append(fold)
        if stage.shaped_fields is None or name in stage.shaped_fields:
            ft.check_shapes(paths, leaves, gs, "updates", f"{stage.name} state .{name}")
        fields.append(leaves)
    ctx, new_global = stage.prepare({k: getattr(state, k) for k in stage.global_fields},
                                    _whole_updates(stage, active, inputs, updates),
                                    **{k: extra_args[k] for k in stage.extra_args})
    return _StageStep(active, fields, ctx, new_global, folds)


def _whole_updates(stage: LeafStage, active: Sequence[bool], inputs: _BlockInputs,
                   updates: Updates) -> Optional[Updates]:
    """What a ``needs_updates`` stage's ``prepare`` reads (else ``None``): the updates, with
    the integer leaves it transforms in the float they are computed in."""
    if not stage.needs_updates:
        return None
    if not any(on and integer_float(g) is not None for g, on in zip(inputs.gs, active)):
        return updates
    return inputs.treedef.unflatten(integers_as_floats(inputs.gs, active))


def _unfold(treedef: Any, field: Any) -> Optional[tuple]:
    """A per-leaf state field in which one placeholder stands for a whole masked-out subtree
    (optax's ``masked`` layout), read per leaf of ``treedef``: ``(its structure, per entry
    the leaf index or the placeholder, the per-leaf entries)``; ``None`` if it is not that."""
    layout = jax.tree_util.tree_structure(field, is_leaf=ft.is_placeholder)
    try:
        covered = layout.flatten_up_to(treedef.unflatten(range(treedef.num_leaves)))
    except (ValueError, TypeError):
        return None
    entries = jax.tree_util.tree_leaves(field, is_leaf=ft.is_placeholder)
    leaves: list = [None] * treedef.num_leaves
    plan = []
    for entry, sub in zip(entries, covered):
        if ft.is_placeholder(entry):
            for i in jax.tree_util.tree_leaves(sub):
                leaves[i] = entry
            plan.append(entry)
        elif isinstance(sub, int):
            leaves[sub] = entry
            plan.append(sub)
        else:
            return None
    return layout, plan, leaves


def _each(fn: Any, *entries: Any) -> Any:
    """``fn`` on one leaf's state entry, or on each array of a list of them (SM3 keeps one
    accumulator per axis: a list per leaf, as optax)."""
    if isinstance(entries[0], list):
        return [fn(*xs) for xs in zip(*entries)]
    return fn(*entries)


def _leaf_pass(stages: Sequence[LeafStage], steps: Sequence[_StageStep], inputs: _BlockInputs,
               io: StateIO) -> tuple[list, list]:
    """Every stage on every leaf, leaf after leaf: the new updates and per-leaf state.

    Each leaf runs in its compute dtype (16-bit as float32) and is cast back; a stage's
    state is read through ``io`` just before the stage runs and written back just after;
    masked-out leaves keep their state (``MaskedNode``) and pass their update through.
    """
    _, gs, ps, _, cds, outs = inputs
    io = io.begin()
    rewrite = recompute.for_block(stages, [s.active for s in steps], [s.ctx for s in steps],
                                  gs, cds)
    out_updates = []
    new_fields: list = [[[] for _ in s.leaf_fields] for s in stages]
    for i, (g, p, cd, out) in enumerate(zip(gs, ps, cds, outs)):
        x = g.astype(cd)
        pc = None if p is None else p.astype(cd)
        leaf = rewrite.for_leaf(x, pc)
        for k, (stage, step) in enumerate(zip(stages, steps)):
            stored = tuple(f[i] for f in step.fields)
            if not step.active[i]:
                news = stored
                leaf.skipped()
            else:
                olds = tuple(_each(io.read, o) for o in stored)
                olds_c = stage.leaf_state(_each(lambda o: o.astype(state_compute_dtype(o, cd)),
                                                o) for o in olds)
                x, news = leaf.run(k, stage, x, olds_c, pc, step.ctx)
                if len(news) != len(stored):
                    raise TypeError(f"{stage.name}: update_leaf returned {len(news)} state "
                                    f"entries for the fields {stage.leaf_fields}; return "
                                    f"state._replace(field=value, ...) (or () if stateless).")
                news = tuple(_each(lambda n, o, st: io.write(n.astype(o.dtype), st), n, o, st)
                             for n, o, st in zip(news, olds, stored))
            for lst, n in zip(new_fields[k], news):
                lst.append(n)
        out_updates.append(x.astype(out))
        io.leaf_done([x for stage_fields in new_fields for lst in stage_fields
                      for x in (lst[i] if isinstance(lst[i], list) else [lst[i]])])
    return out_updates, new_fields


def stage_transform(stage: LeafStage) -> GradientTransformation:
    """A ``GradientTransformation`` running one stage; ``chain`` can fuse it.

    Args:
      stage: the stage.

    Returns:
      ``(init, update)`` for the stage; ``update`` accepts (and passes the
      stage) extra keyword arguments.

    >>> import jax.numpy as jnp
    >>> neg = stage_transform(LeafStage(name='neg', update_leaf=lambda g, s, p, c: (-g, ())))
    >>> neg.update([jnp.ones(2)], neg.init([jnp.ones(2)]))[0]
    [Array([-1., -1.], dtype=float32)]
    """
    return GradientTransformation(stage.init_function(), Program((((), stage),)))


def in_masked_state(tx: Any, owner: str = "masked",
                    init: Optional[Any] = None) -> GradientTransformationExtraArgs:
    """``tx`` with its state inside :class:`~functrain.engine.protocol.MaskedState`.

    optax's layout for a masked transformation (``masked``, ``freeze``, a masked weight
    decay). The steps are ``tx`` 's, each at ``(0,) + path``, so an enclosing ``chain`` still
    fuses its stages; ``tx`` 's guards run on the inner state when it is called alone.

    Args:
      tx: the transformation, already restricted to its mask (a stage's ``mask``).
      owner: its name in the error for a state of another class.
      init: ``init(params) -> MaskedState``; default ``MaskedState(tx.init(params))``.

    Returns:
      A transformation whose state is ``MaskedState(inner_state=tx's state)``.

    >>> import jax.numpy as jnp
    >>> tx = in_masked_state(identity())
    >>> tx.update([jnp.ones(1)], tx.init([jnp.ones(1)]))
    ([Array([1.], dtype=float32)], MaskedState(inner_state=EmptyState()))
    """
    update = getattr(tx, "update", None)
    guards = update.guards if isinstance(update, Program) and update.io is PLAIN_STATE else ()

    def on_inner(guard: Any) -> Any:
        def outer(run: Any, updates: Updates, state: OptState, params: Optional[Params],
                  extra_args: dict) -> tuple[Updates, OptState]:
            def run_inner(u: Updates, inner: OptState, p: Optional[Params],
                          e: dict) -> tuple[Updates, OptState]:
                u, new = run(u, state._replace(inner_state=inner), p, e)
                return u, new.inner_state
            u, inner = guard(run_inner, updates, state.inner_state, params, extra_args)
            return u, state._replace(inner_state=inner)
        return outer

    def check_state(run: Any, updates: Updates, state: OptState, params: Optional[Params],
                    extra_args: dict) -> tuple[Updates, OptState]:
        check_state_type(state, MaskedState, owner)
        return run(updates, state, params, extra_args)

    steps = tuple(((0,) + path, item) for path, item in fusion_plan(tx))
    return GradientTransformationExtraArgs(
        init or (lambda params: MaskedState(tx.init(params))),
        Program(steps, guards=tuple(on_inner(g) for g in guards) + (check_state,)))


def fusion_plan(tx: Any) -> tuple:
    """How ``chain`` sees ``tx``: ``((state path, stage or transformation), ...)``.

    A stage (or a chain of them) lists its ``LeafStage`` s with the path of
    each one's state inside ``tx``'s state; any other transformation is one
    opaque entry with the empty path.

    Args:
      tx: a transformation.

    Returns:
      A tuple of ``(path, item)`` pairs.

    >>> [type(item).__name__ for _, item in fusion_plan(identity())]
    ['LeafStage']
    """
    update = getattr(tx, "update", None)
    if isinstance(update, Program) and update.io is PLAIN_STATE:
        return update.steps
    return (((), tx),)


def chain(*transforms: Any) -> GradientTransformationExtraArgs:
    """Apply transformations in sequence; consecutive functrain stages are fused.

    Accepts functrain and optax transformations alike (anything with ``init``
    and ``update``); extra keyword arguments of ``update`` are passed to every
    transformation that accepts them.

    Args:
      *transforms: the transformations, applied first to last.

    Returns:
      A transformation whose state is a tuple of each transformation's state.

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
                 for path, item in fusion_plan(tx))

    def init_fn(params: Params) -> OptState:
        return tuple(tx.init(params) for tx in transforms)

    def check_state(run: Any, updates: Updates, state: OptState, params: Optional[Params],
                    extra_args: dict) -> tuple[Updates, OptState]:
        if not isinstance(state, tuple) or len(state) != len(transforms):
            raise state_mismatch_error(
                f"chain of {len(transforms)} transformations",
                f"got a state of type {type(state).__name__} with "
                f"{len(state) if isinstance(state, tuple) else '?'} entries", "this chain")
        return run(updates, state, params, extra_args)

    chained = GradientTransformationExtraArgs(init_fn, Program(plan, guards=(check_state,)))
    record_parts(chained, [((i,), tx) for i, tx in enumerate(transforms)])
    return chained


def run_plan(plan: tuple, updates: Updates, state: OptState, params: Optional[Params],
             extra_args: dict, io: StateIO = PLAIN_STATE) -> tuple[Updates, OptState]:
    """Run a fusion plan (see :func:`fusion_plan`): each block of stages in one pass.

    Args:
      plan: ``((state path, LeafStage or transformation), ...)``.
      updates: the incoming updates.
      state: the state the plan's paths point into.
      params: the parameters, or ``None``.
      extra_args: ``update``'s extra keyword arguments.
      io: as for :func:`run_block`; a transformation that is not a stage runs through
        ``io.update_opaque(tx, updates, state, params, extra_args)``.

    Returns:
      ``(new_updates, new_state)``.

    >>> import jax.numpy as jnp
    >>> run_plan(fusion_plan(identity()), [jnp.ones(1)], identity().init(None), None, {})
    ([Array([1.], dtype=float32)], EmptyState())
    """
    i = 0
    while i < len(plan):
        path, item = plan[i]
        if not isinstance(item, LeafStage):
            updates, new = io.update_opaque(item, updates, ft.get_path(state, path), params,
                                            extra_args)
            state = ft.set_path(state, path, new)
            i += 1
            continue
        j = i + 1
        while (j < len(plan) and isinstance(plan[j][1], LeafStage)
               and not plan[j][1].needs_updates):
            j += 1
        block = plan[i:j]
        updates, news = run_block([s for _, s in block], updates,
                                  [ft.get_path(state, p) for p, _ in block], params,
                                  extra_args, io)
        for (p, _), new in zip(block, news):
            state = ft.set_path(state, p, new)
        i = j
    return updates, state


def named_chain(*transforms: tuple[str, GradientTransformation]
                ) -> GradientTransformationExtraArgs:
    """``chain`` whose state is a dict keyed by the given names.

    The stages inside are fused exactly as in :func:`chain`.

    Args:
      *transforms: ``(name, transformation)`` pairs; names must be unique.

    Returns:
      A transformation whose state maps each name to that transformation's state.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.named_chain(('clip', functrain.clip(1.0)), ('lr', functrain.scale(-0.1)))
    >>> state = tx.init([jnp.zeros(1)])
    >>> sorted(state)
    ['clip', 'lr']
    >>> tx.update([jnp.array([5.])], state)[0]
    [Array([-0.1], dtype=float32)]
    """
    names = []
    for i, item in enumerate(transforms):
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise TypeError(f"named_chain argument {i} must be a (name, transformation) "
                            f"pair, got {type(item).__name__}.")
        check_transformation(item[1], "named_chain", f"the transformation named {item[0]!r}")
        names.append(item[0])
    if len(set(names)) != len(names):
        raise ValueError(f"named_chain: names must be unique, got {names}.")
    inner = chain(*(tx for _, tx in transforms))

    def init_fn(params: Params) -> dict:
        return dict(zip(names, inner.init(params)))

    def update_fn(updates: Updates, state: dict, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, dict]:
        if not isinstance(state, Mapping) or set(state) != set(names):
            got = sorted_labels(state) if isinstance(state, Mapping) else type(state).__name__
            raise state_mismatch_error("named_chain", f"expected a state dict with keys "
                                       f"{names}, got {got}", "this named_chain")
        new_updates, new = inner.update(updates, tuple(state[n] for n in names), params,
                                        **extra_args)
        return new_updates, dict(zip(names, new))

    named = GradientTransformationExtraArgs(init_fn, update_fn)
    record_parts(named, [((name,), tx) for name, tx in transforms])
    return named


def identity() -> GradientTransformation:
    """The transformation that leaves updates unchanged and keeps no state.

    Returns:
      A stateless stage that returns its input.

    >>> import jax.numpy as jnp
    >>> tx = identity()
    >>> tx.update([jnp.ones(1)], tx.init([jnp.ones(1)]))
    ([Array([1.], dtype=float32)], EmptyState())
    """
    return stage_transform(LeafStage(name="identity", update_leaf=lambda g, s, p, c: (g, ()),
                                     checks=LeafChecks(any_dtype=True)))


__all__ = ["run_block", "run_plan", "stage_transform", "in_masked_state", "chain", "named_chain",
           "identity", "fusion_plan", "Program", "with_guard",
           # from engine/dtypes.py, where the families' per-leaf loops (shampoo, ...) import them
           "leaf_compute_dtype", "state_compute_dtype"]
