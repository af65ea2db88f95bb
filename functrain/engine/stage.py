"""``LeafStage``: the per-array math of one transformation, lifted over pytrees by the engine.

Every functrain building block (``scale_by_adam``, ``trace``, ...) is a :class:`LeafStage`:
how one leaf's update and state change, what its state looks like, what is computed once
per step (``prepare``), and what the engine checks of the inputs before any math
(:class:`LeafChecks`). The engine (:mod:`functrain.engine.program`) runs stages over the
tree and exposes them as optax's ``GradientTransformation`` (:mod:`.protocol`).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any, Callable, Iterable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain import tree as ft
from functrain.engine.dtypes import integers_as_floats
from functrain.engine.protocol import EmptyState, OptState, Params


class LeafChecks(NamedTuple):
    """What the engine checks of a stage's inputs, before any array math (one field of
    :class:`LeafStage`: ``checks=LeafChecks(real_only=True)``); each failure is an error
    naming the leaf's key path.

    Attributes:
      needs_params: ``update`` raises unless params are given.
      shaped_fields: the ``leaf_fields`` whose per-leaf state has the parameter's
        shape (the engine checks those shapes); ``None`` means all of them. Stages
        with reduced per-leaf state (Adafactor's factored moments, SM3's
        per-dimension accumulators) list only the others.
      real_only: the math has no complex version (sign flips, clipping by value):
        complex leaves raise a ``TypeError`` naming the leaf.
      any_dtype: the stage does no arithmetic (``set_to_zero``, ``freeze``,
        ``identity``): every dtype passes through unchanged. Every other stage
        computes integer leaves in the float jnp's arithmetic gives them (as optax),
        refuses integer params where it keeps per-leaf state, and refuses bool
        leaves, with a ``TypeError`` naming the leaf.

    >>> LeafChecks(real_only=True)
    LeafChecks(needs_params=False, shaped_fields=None, real_only=True, any_dtype=False)
    """

    needs_params: bool = False
    shaped_fields: Optional[tuple[str, ...]] = None
    real_only: bool = False
    any_dtype: bool = False


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
      needs_updates: ``prepare`` reads the whole incoming tree (e.g. a global
        norm); such a stage starts a new fused block.
      mask: ``None``, a tree (or prefix) of bools, or a function of params:
        leaves where it is False pass through and hold no state.
      checks: what the engine checks of the inputs before any math
        (:class:`LeafChecks`: params required, shaped state fields, real or any
        dtype); read through the properties of the same names
        (``stage.needs_params``, ...).

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
    needs_updates: bool = False
    mask: Any = None
    checks: LeafChecks = LeafChecks()

    @property
    def needs_params(self) -> bool:
        """``checks.needs_params``: ``update`` raises unless params are given."""
        return self.checks.needs_params

    @property
    def shaped_fields(self) -> Optional[tuple[str, ...]]:
        """``checks.shaped_fields``: the leaf fields shaped like the params (None: all)."""
        return self.checks.shaped_fields

    @property
    def real_only(self) -> bool:
        """``checks.real_only``: complex leaves are refused."""
        return self.checks.real_only

    @property
    def any_dtype(self) -> bool:
        """``checks.any_dtype``: every dtype passes through (the stage does no arithmetic)."""
        return self.checks.any_dtype

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
