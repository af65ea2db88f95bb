"""optax's protocol: ``GradientTransformation`` (and ``GradientTransformationExtraArgs``),
the ``(init, update)`` pair every optimizer, stage, wrapper and chain is, with its states'
common shapes (``EmptyState``, ``MaskedState``), its type names and how an ``update`` is
called with extra keywords (:func:`call_update`, :func:`with_extra_args_support`).

The per-array math a transformation is built from is :mod:`functrain.engine.stage`; the
engine that runs it, :mod:`functrain.engine.program`.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
from typing import Any, Callable, NamedTuple, Optional

from functrain.arg_checks import check_transformation

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
