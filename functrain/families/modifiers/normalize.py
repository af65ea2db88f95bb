"""``normalize``: divide the updates by their global norm (optax.contrib's SAM helper).

optax.contrib defines it beside SAM, whose adversarial step ascends along the
normalised gradient (``chain(normalize(), sgd(rho))``). It is one
:class:`~functrain.engine.stage.LeafStage` whose ``prepare`` reads the
whole tree (the global norm) and whose leaf math is one division, so it fuses
with the stages after it.
"""

from __future__ import annotations

from typing import Any

import jax

from functrain.declarations import declare_optimizer, hyperparameters
from functrain import tree as ft
from functrain.engine.protocol import EmptyState, GradientTransformation
from functrain.engine.stage import LeafStage
from functrain.engine.program import stage_transform

Array = jax.Array

__all__ = ["NormalizeState", "normalize"]

NormalizeState = EmptyState
"""State of :func:`normalize`: none (optax's ``NormalizeState`` is ``EmptyState`` too).

>>> import jax.numpy as jnp
>>> normalize().init([jnp.ones(1)])
EmptyState()
"""


@declare_optimizer("contrib", "optax.contrib.normalize (no paper)", optax="contrib",
    summary="Unit global-norm updates; a real optimizer on complex parameters' two parts.")
@hyperparameters()  # none: recorded for current_hyperparams
def normalize() -> GradientTransformation:
    """Divide the updates by their global L2 norm: ``u = g / ||g||``.

    The norm is taken over all leaves together (complex leaves count ``|g|``),
    so the result has norm 1. As in optax, all-zero updates give NaN (``0 / 0``):
    the caller must not feed them.

    Returns:
      A stateless ``GradientTransformation`` (state :data:`NormalizeState`).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.contrib.normalize()
    >>> tx.update({'a': jnp.array([3.]), 'b': jnp.array([-4.])}, tx.init(None))[0]
    {'a': Array([0.6], dtype=float32), 'b': Array([-0.8], dtype=float32)}
    """
    def prepare(glob: dict, updates: Any) -> tuple:
        return ft.norm(updates), glob

    return stage_transform(LeafStage(
        name="normalize", update_leaf=lambda g, s, p, g_norm: (g / g_norm, ()),
        prepare=prepare, needs_updates=True))
