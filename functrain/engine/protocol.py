"""The protocol layer: ``GradientTransformation``, ``LeafStage`` and validation helpers.

Every functrain building block (``scale_by_adam``, ``trace``, ...) is a
:class:`LeafStage`: the per-array math of one transformation plus the small
amount of scalar bookkeeping (a step count, a schedule value) it needs. The
engine (:mod:`functrain.engine.program`) lifts stages over pytrees and
exposes them as ordinary optax-style ``GradientTransformation`` s.

This module holds only the types and small helpers every layer above shares;
it imports nothing from functrain but :mod:`functrain.tree`.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import importlib.util
import inspect
import os
from typing import Any, Callable, Iterable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain import tree as ft
from functrain.engine.dtypes import integers_as_floats
from functrain.arg_checks import check_transformation
from functrain.numerics import safe_int32_increment

PyTree = Any
Params = Any
Updates = Any
OptState = Any
ScalarOrSchedule = Any  # float | jax.Array | Callable[[jax.Array], jax.Array]
MaskOrFn = Any  # a tree (or prefix) of bools, or a function of params returning one
# optax's names for the two halves of a transformation: init(params) -> state and
# update(updates, state, params=None) -> (updates, state).
TransformInitFn = Callable[[Params], OptState]
TransformUpdateFn = Callable[..., tuple]
# update(updates, state, params=None, **extra_args) -> (updates, state): an update that
# takes extra keyword arguments (a loss ``value``, a ``value_fn``, ...) and ignores
# those it does not need; see GradientTransformationExtraArgs.
TransformUpdateExtraArgsFn = Callable[..., tuple]


def _optax_protocol() -> tuple:
    """optax's ``(GradientTransformation, GradientTransformationExtraArgs)`` classes when an
    optax is installed, else ``None``: functrain's two classes subclass them, so libraries
    that check ``isinstance(tx, optax.GradientTransformation)`` (numpyro's ``SVI``) take
    functrain's optimizers. optax is never required: without it the classes are plain
    NamedTuples of the same two fields. ``FUNCTRAIN_OPTAX_TYPES=0`` keeps them plain."""
    if os.environ.get("FUNCTRAIN_OPTAX_TYPES", "1") == "0":
        return None
    try:
        if importlib.util.find_spec("optax") is None:
            return None
        import optax
        base, extra = optax.GradientTransformation, optax.GradientTransformationExtraArgs
    except Exception:  # noqa: BLE001 -- a broken optax install: keep functrain's own classes
        return None
    fields = getattr(base, "_fields", None)
    return (base, extra) if fields == ("init", "update") and issubclass(extra, base) else None


class _TransformationPair(NamedTuple):
    """The two fields, for a functrain without optax (see :func:`_optax_protocol`)."""

    init: Callable[[Params], OptState]
    update: Callable[..., tuple[Updates, OptState]]


_OPTAX_PROTOCOL = _optax_protocol()


class GradientTransformation(_OPTAX_PROTOCOL[0] if _OPTAX_PROTOCOL else _TransformationPair):
    """An optimizer as a pair of pure functions, optax's protocol.

    It is a two-field NamedTuple, so functrain and optax transformations compose in both
    libraries' ``chain``. Where optax is installed it is a subclass of
    ``optax.GradientTransformation`` (and :class:`GradientTransformationExtraArgs` of
    ``optax.GradientTransformationExtraArgs``), so code that checks optax's types takes
    functrain's transformations; without optax it is a plain NamedTuple of the same fields.

    Attributes:
      init: ``init(params) -> state``.
      update: ``update(updates, state, params=None, **extra_args) -> (updates,
        state)``.

    >>> import jax.numpy as jnp
    >>> tx = GradientTransformation(lambda p: (), lambda u, s, p=None: (u, s))
    >>> tx.update({'w': jnp.ones(1)}, tx.init({'w': jnp.ones(1)}))[0]
    {'w': Array([1.], dtype=float32)}
    >>> tx._fields
    ('init', 'update')
    """

    __slots__ = ()


class GradientTransformationExtraArgs(GradientTransformation,
                                      *(_OPTAX_PROTOCOL[1:] if _OPTAX_PROTOCOL else ())):
    """A ``GradientTransformation`` whose ``update`` takes extra keyword arguments.

    optax's protocol for transformations that need more than the gradients,
    e.g. a line search's ``value=``, ``grad=`` and ``value_fn=``: ``update(updates,
    state, params=None, **extra_args)`` uses the keywords it needs and ignores
    the others. It is still a ``GradientTransformation`` (a subclass, the same
    two fields), so ``chain`` passes the extra keywords on to it (optax's ``chain``
    too, where optax is installed: it is then an ``optax.GradientTransformationExtraArgs``).
    :func:`with_extra_args_support` makes one from any transformation.

    Attributes:
      init: ``init(params) -> state``.
      update: ``update(updates, state, params=None, **extra_args) -> (updates,
        state)``.

    >>> import jax.numpy as jnp
    >>> tx = GradientTransformationExtraArgs(
    ...     lambda p: (), lambda u, s, p=None, *, value, **extra: (u * value, s))
    >>> isinstance(tx, GradientTransformation)
    True
    >>> tx.update(jnp.ones(2), tx.init(jnp.ones(2)), value=3.0, unused='ignored')[0]
    Array([3., 3.], dtype=float32)
    """

    __slots__ = ()


class EmptyState(NamedTuple):
    """The state of a transformation that keeps none.

    Attributes:
      (none): an empty NamedTuple, so it holds no arrays.

    >>> EmptyState()
    EmptyState()
    """


class MaskedState(NamedTuple):
    """State of a transformation restricted by a mask (optax's ``masked`` layout).

    :func:`functrain.masked` returns it for every inner transformation, as optax's does;
    ``add_decayed_weights(..., mask=...)``, ``freeze`` and ``lars`` 's trust ratio keep
    their stage's state in it too. A stage inside still fuses into an enclosing ``chain``
    (the engine's ``in_masked_state``).

    Attributes:
      inner_state: the wrapped transformation's state; masked-out leaves hold
        ``MaskedNode`` placeholders (no buffers) in its params-shaped fields, one for a
        whole subtree that the mask switches off with one bool, as in optax.

    >>> MaskedState(inner_state=EmptyState())
    MaskedState(inner_state=EmptyState())
    """

    inner_state: Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class LeafStage:
    """The per-array math of one transformation, lifted over pytrees by the engine.

    Built by keyword. Per step the engine calls ``prepare`` once, then
    ``update_leaf`` on every leaf.

    Attributes:
      name: the public name, used in error messages.
      update_leaf: ``(g, state, p, ctx) -> (u, new_state)`` on one array.
        ``state`` is a NamedTuple with one entry per ``leaf_fields`` name
        (read ``state.mu``); ``new_state`` is ``state._replace(mu=..., ...)``
        (by field name; a field not named keeps its value), ``()`` when the
        stage keeps no per-leaf state. ``p`` is the parameter (``None`` when
        not given), ``ctx`` what ``prepare`` returned.
      state_cls: the state NamedTuple, or ``None`` for :class:`EmptyState`.
      leaf_fields: fields of ``state_cls`` that hold a params-shaped tree.
      init_leaf: ``p -> tuple`` of initial per-leaf states, one per field.
      init_global: ``() -> dict`` of scalar state fields (e.g. ``count``).
      prepare: ``(global_fields, updates, **extra) -> (ctx, new_global_fields)``;
        runs once per step, before the leaf pass. ``updates`` is the block's
        input tree when ``needs_updates`` else ``None``; ``extra`` holds the
        ``update`` keywords named in ``extra_args``.
      extra_args: names of ``update``'s keyword arguments that ``prepare``
        receives (e.g. ``('value',)`` for the loss); ``update`` raises a clear
        error when one is missing.
      needs_params: ``update`` raises unless params are given.
      needs_updates: ``prepare`` reads the whole incoming tree (e.g. a global
        norm); such a stage starts a new fused block.
      mask: ``None``, a tree (or prefix) of bools, or a function of params:
        leaves where it is False pass through and hold no state.
      shaped_fields: the ``leaf_fields`` whose per-leaf state has the
        parameter's shape (the engine checks those shapes); ``None`` means all
        of them. Stages with reduced per-leaf state (Adafactor's factored
        moments, SM3's per-dimension accumulators) list only the others.
      real_only: the math has no complex version (sign flips, clipping by
        value): complex leaves raise a ``TypeError`` naming the leaf.
      any_dtype: the stage does no arithmetic (``set_to_zero``, ``freeze``,
        ``identity``): every dtype passes through unchanged. Every other stage
        computes integer leaves in the float jnp's arithmetic gives them (as optax),
        refuses integer params where it keeps per-leaf state, and refuses bool
        leaves, with a ``TypeError`` naming the leaf.

    >>> import jax.numpy as jnp
    >>> from functrain.engine.program import stage_transform
    >>> double = stage_transform(LeafStage(name='double',
    ...                                    update_leaf=lambda g, s, p, c: (2 * g, ())))
    >>> double.update({'w': jnp.ones(1)}, double.init({'w': jnp.ones(1)}))[0]
    {'w': Array([2.], dtype=float32)}
    """

    name: str
    update_leaf: Callable[..., tuple[Any, tuple]]
    state_cls: Optional[type] = None
    leaf_fields: tuple[str, ...] = ()
    init_leaf: Callable[[Any], tuple] = lambda p: ()
    init_global: Callable[[], dict] = dict
    prepare: Callable[..., tuple[Any, dict]] = lambda glob, updates: (None, glob)
    extra_args: tuple[str, ...] = ()
    needs_params: bool = False
    needs_updates: bool = False
    mask: Any = None
    shaped_fields: Optional[tuple[str, ...]] = None
    real_only: bool = False
    any_dtype: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _register_stage_pytree(cls)

    def init_function(self) -> Callable[[Params], OptState]:
        """:meth:`init_state` as a transformation's ``init``: a pytree of this stage (a
        ``jax.tree_util.Partial``), so that its hyperparameters are seen as the stage's.

        Returns:
          ``init(params) -> state``.
        """
        return jax.tree_util.Partial(type(self).init_state, self)

    @property
    def global_fields(self) -> list[str]:
        """The scalar (not per-leaf) fields of ``state_cls``, e.g. ``['count']``."""
        if self.state_cls is None:
            return []
        return [f for f in self.state_cls._fields if f not in self.leaf_fields]

    def leaf_state(self, values: Iterable[Any]) -> tuple:
        """``values`` (one per ``leaf_fields``) as the NamedTuple ``update_leaf`` reads."""
        return _leaf_state_type(self.leaf_fields)(*values)

    def init_state(self, params: Params) -> OptState:
        """The stage's state for ``params`` (checks the mask fits them, too).

        Args:
          params: the parameter tree.

        Returns:
          An instance of ``state_cls`` (or :class:`EmptyState`): per-leaf fields
          as trees like ``params`` (``MaskedNode`` where masked out), global
          fields from ``init_global``.
        """
        active = ft.resolve_leaf_mask(self.mask, params, self.name)
        paths, leaves, treedef = ft.flatten_with_paths(params)
        if not self.any_dtype:
            ft.check_leaf_dtypes(paths, leaves, active, self.name, "params",
                                 real_only=self.real_only, integers=True)
        if self.state_cls is None:
            return EmptyState()
        # An integer param's state is kept in the float its arithmetic runs in (float32,
        # float64 with x64), not in its own dtype (optax's int32 nu is truncated to 0).
        leaves = [as_array(p) for p in leaves]
        if not self.any_dtype:
            leaves = integers_as_floats(leaves, active)
        per_field: list[list[Any]] = [[] for _ in self.leaf_fields]
        for p, on in zip(leaves, active):
            values = self.init_leaf(p) if on else (ft.MaskedNode(),) * len(self.leaf_fields)
            for lst, v in zip(per_field, values):
                lst.append(v)
        fields = dict(self.init_global())
        for name, lst in zip(self.leaf_fields, per_field):
            fields[name] = treedef.unflatten(lst)
        return ft.distinct_buffers(self.state_cls(**fields))  # so that it can be donated


# A stage is a pytree whose children are its functions (and its mask), the rest static, as
# optax's closures are under Equinox's ``closure_to_pytree``: that turns each function's
# closed-over hyperparameters into leaves, so that equal optimizers compare equal under
# ``eqx.filter_jit`` and array hyperparameters are traced instead of retraced. Subclasses
# are registered as they are defined.
def _is_stage_child(name: str, value: Any) -> bool:
    return name == "mask" or (callable(value) and not isinstance(value, type))


def _register_stage_pytree(cls: type) -> None:
    def flatten(stage: LeafStage) -> tuple[tuple, tuple]:
        names, children, static = [], [], []
        for f in dataclasses.fields(stage):
            value = getattr(stage, f.name)
            if _is_stage_child(f.name, value):
                names.append(f.name)
                children.append(value)
            else:
                static.append((f.name, value))
        return tuple(children), (tuple(names), tuple(static))

    def unflatten(aux: tuple, children: tuple) -> LeafStage:
        names, static = aux
        stage = object.__new__(cls)  # no checks: children may be any placeholders
        for name, value in (*static, *zip(names, children)):
            object.__setattr__(stage, name, value)
        return stage

    jax.tree_util.register_pytree_node(cls, flatten, unflatten)


_register_stage_pytree(LeafStage)


def as_array(x: Any) -> Any:
    """``x`` itself if it has a dtype, else ``jnp.asarray(x)`` (Python numbers as parameters).

    Args:
      x: a leaf.

    Returns:
      An array-like with ``shape`` and ``dtype``.

    >>> as_array(1.0)
    Array(1., dtype=float32, weak_type=True)
    """
    return x if hasattr(x, "dtype") else jnp.asarray(x)


@functools.lru_cache(maxsize=None)
def _leaf_state_type(fields: tuple[str, ...]) -> type:
    return collections.namedtuple("LeafState", fields)


# --------------------------------------------------------------------------
# Step counters
# --------------------------------------------------------------------------

# ``count + 1`` saturating at the dtype's maximum: optax's safe_int32_increment (one copy,
# in numerics.py), under the name functrain has exported since its first release.
safe_increment = safe_int32_increment


def zero_count() -> dict:
    """``{'count': int32 0}``: the global state of stages that count steps.

    Returns:
      A dict with one int32 scalar zero under ``'count'``.

    >>> zero_count()
    {'count': Array(0, dtype=int32)}
    """
    return {"count": jnp.zeros([], jnp.int32)}


def value_at(x: ScalarOrSchedule, count: Any) -> Any:
    """The value of a hyperparameter that may be a schedule: ``x(count)`` or ``x`` itself.

    Args:
      x: a number, an array, or a schedule (a callable of the step count).
      count: the step count to evaluate a schedule at.

    Returns:
      ``x(count)`` if ``x`` is callable, else ``x``.

    >>> value_at(lambda t: 0.1 * t, 3), value_at(0.5, 3)
    (0.30000000000000004, 0.5)
    """
    return x(count) if callable(x) else x


def count_only(glob: dict, updates: Any) -> tuple[None, dict]:
    """A ``prepare`` that only advances the step count (no context).

    Args:
      glob: the stage's global fields, holding ``count``.
      updates: unused.

    Returns:
      ``(None, {'count': count + 1})``.

    >>> import jax.numpy as jnp
    >>> count_only({'count': jnp.asarray(1)}, None)
    (None, {'count': Array(2, dtype=int32)})
    """
    del updates
    return None, {"count": safe_increment(glob["count"])}


def _accepts_extra_args(fn: Callable) -> bool:
    """Whether ``fn`` takes ``**kwargs`` (True when its signature is unknown)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def call_update(tx: Any, updates: Updates, state: OptState, params: Optional[Params],
                extra_args: dict) -> tuple[Updates, OptState]:
    """``tx.update(updates, state, params, **extra_args)``, dropping extras ``tx`` cannot take.

    Args:
      tx: a transformation (functrain's, optax's, or user-written).
      updates: the incoming updates.
      state: ``tx``'s state.
      params: the parameters or ``None``.
      extra_args: keyword arguments of the enclosing ``update`` (e.g. ``value``).

    Returns:
      ``(new_updates, new_state)`` from ``tx.update``.

    >>> import jax.numpy as jnp
    >>> tx = GradientTransformation(lambda p: (), lambda u, s, p=None: (u, s))
    >>> call_update(tx, [jnp.ones(1)], (), None, {'value': 1.0})[0]
    [Array([1.], dtype=float32)]
    """
    if extra_args and _accepts_extra_args(tx.update):
        return tx.update(updates, state, params, **extra_args)
    return tx.update(updates, state, params)


class StateIO:
    """How the engine reads and writes the per-leaf state of stages: as it is (this class).

    :func:`~functrain.quantized_state` passes another implementation (its block-wise codes)
    to the engine; every method here is the identity, so plain state costs nothing. Per pass
    over the leaves the engine calls :meth:`begin` once, then for each active stage on each
    leaf :meth:`read` before the stage and :meth:`write` after it, and :meth:`leaf_done`
    when a leaf is finished. A transformation that is not a stage runs through
    :meth:`update_opaque`.

    >>> import jax.numpy as jnp
    >>> io = PLAIN_STATE.begin()
    >>> io.read(jnp.ones(1)), io.write(jnp.zeros(1), jnp.ones(1))
    (Array([1.], dtype=float32), Array([0.], dtype=float32))
    """

    def __eq__(self, other: Any) -> bool:
        # An I/O carries no configuration: two of one class are interchangeable (so that
        # equal programs compare equal, under Equinox's filter_jit say).
        return type(self) is type(other)

    def __hash__(self) -> int:
        return hash(type(self))

    def begin(self) -> "StateIO":
        """The reader/writer for one pass over the leaves (one with its own memory, if any).

        Returns:
          ``self`` here.
        """
        return self

    def read(self, stored: Any) -> Any:
        """The value a stage reads from a stored per-leaf state entry.

        Args:
          stored: the entry as it is kept in the state.

        Returns:
          ``stored`` here.
        """
        return stored

    def write(self, new: Any, stored: Any) -> Any:
        """What is kept for ``new``, the stage's new value of the entry ``stored``.

        Args:
          new: the new value, in the dtype the stage read.
          stored: the entry it replaces, as kept.

        Returns:
          ``new`` here.
        """
        return new

    def leaf_done(self, written: list) -> None:
        """Told what was kept for one leaf (every stage's entries), after its pass.

        Args:
          written: the entries kept for the leaf.
        """
        del written

    def update_opaque(self, tx: Any, updates: Updates, state: OptState,
                      params: Optional[Params], extra_args: dict) -> tuple[Updates, OptState]:
        """Run a transformation that is not a stage, with its whole state.

        Args:
          tx: the transformation.
          updates: the incoming updates.
          state: ``tx``'s state, as kept.
          params: the parameters or ``None``.
          extra_args: ``update``'s extra keyword arguments.

        Returns:
          ``(new_updates, new_state)``; here :func:`call_update`'s.
        """
        return call_update(tx, updates, state, params, extra_args)


#: The state I/O of everything but low-bit state: entries read and written as they are.
PLAIN_STATE = StateIO()


def with_extra_args_support(tx: GradientTransformation) -> GradientTransformationExtraArgs:
    """``tx`` as a :class:`GradientTransformationExtraArgs` (optax's name and behaviour).

    An ``update`` that already takes ``**kwargs`` (every functrain
    transformation's) keeps them, so a stage that needs one (``scale_by_polyak``'s
    ``value``) still gets it, and ``chain`` still fuses the stages inside; any
    other ``update`` is wrapped to accept extra keywords and drop them.

    Args:
      tx: a transformation (functrain's, optax's or user-written).

    Returns:
      ``tx`` itself if it is already a ``GradientTransformationExtraArgs``, else
      one with the same ``init`` and an ``update`` that accepts extra keywords.

    >>> import jax.numpy as jnp
    >>> plain = GradientTransformation(lambda p: (), lambda u, s, p=None: (2 * u, s))
    >>> tx = with_extra_args_support(plain)
    >>> tx.update(jnp.ones(1), (), None, value=1.0)[0]
    Array([2.], dtype=float32)
    """
    check_transformation(tx, "with_extra_args_support", "tx")
    if isinstance(tx, GradientTransformationExtraArgs):
        return tx
    if _accepts_extra_args(tx.update):
        return GradientTransformationExtraArgs(tx.init, tx.update)
    inner = tx.update

    def update_fn(updates: Updates, state: OptState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, OptState]:
        del extra_args
        return inner(updates, state, params)

    return GradientTransformationExtraArgs(tx.init, update_fn)
