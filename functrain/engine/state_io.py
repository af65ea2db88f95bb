"""``StateIO``: how the engine's per-leaf pass reads and writes each stage's state.

:data:`PLAIN_STATE` (this module's :class:`StateIO`, the identity) for everything but
low-bit state; :func:`functrain.quantized_state`'s is the other implementation
(:mod:`functrain.quantized_state`): it dequantizes a leaf's state just before its stage
runs and quantizes it just after.
"""

from __future__ import annotations

from typing import Any, Optional

from functrain.engine.protocol import OptState, Params, Updates, call_update


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
