"""Normalizing gradients: centralizing, dividing by the global norm, scaling the backward pass.

``centralize`` is a per-leaf stage; ``normalize_by_update_norm`` needs the norm
of the whole tree, which its ``prepare`` computes once per step (so it starts
a new fused block). ``scale_gradient`` is not a transformation but a function
used inside a loss: the identity going forward, a scaled gradient going back.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from functrain.arg_checks import check_range, concrete_real
from functrain.declarations import hyperparameters
from functrain import tree as ft
from functrain.engine.protocol import GradientTransformation
from functrain.engine.stage import LeafStage
from functrain.engine.program import stage_transform

Array = jax.Array

def centralize() -> GradientTransformation:
    """Subtract from each update its mean over all but the leading axis (for rank >= 2).

    For a leaf of rank 2 or more, ``g - mean(g, axes 1..)`` (each row, output
    channel or leading slice, is centred); scalars and vectors pass unchanged.
    Reference: Yong et al., 2020, "Gradient Centralization: A New Optimization
    Technique for Deep Neural Networks".

    Returns:
      A ``GradientTransformation`` that keeps no state (``EmptyState``).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.centralize()
    >>> g = jnp.array([[1., 2., 3.], [4., 5., 9.]])
    >>> tx.update(g, tx.init(g))[0]
    Array([[-1.,  0.,  1.],
           [-2., -1.,  3.]], dtype=float32)
    """
    def leaf(g: Array, s: tuple, p: Any, c: Any) -> tuple:
        if g.ndim < 2:
            return g, ()
        return g - jnp.mean(g, axis=tuple(range(1, g.ndim)), keepdims=True), ()

    return stage_transform(LeafStage(name="centralize", update_leaf=leaf))


@hyperparameters(scale_factor="number", eps="number")
def normalize_by_update_norm(scale_factor: float = 1.0, eps: float = 1e-6
                             ) -> GradientTransformation:
    """Divide all updates by their global L2 norm (plus ``eps``), times ``scale_factor``.

    With ``n`` the L2 norm of all leaves together, the update is
    ``g * scale_factor / (n + eps)``: a step of length about ``|scale_factor|``
    in the gradient's direction (``scale_factor=-lr`` for normalized gradient
    descent).

    Args:
      scale_factor: the length of the normalized update (negative to descend).
      eps: added to the norm, ``>= 0``, so zero updates stay finite.

    Returns:
      A ``GradientTransformation`` that keeps no state (``EmptyState``).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.normalize_by_update_norm(scale_factor=2.0, eps=0.0)
    >>> tx.update({'a': jnp.array([3.]), 'b': jnp.array([4.])}, tx.init({}))[0]
    {'a': Array([1.2], dtype=float32), 'b': Array([1.6], dtype=float32)}
    """
    check_range("eps", eps, 0.0, owner="normalize_by_update_norm")

    def prepare(glob: dict, updates: Any) -> tuple:
        return (ft.norm(updates) + eps) / scale_factor, glob

    def leaf(g: Array, s: tuple, p: Any, divisor: Array) -> tuple:
        return g / divisor.astype(g.real.dtype), ()

    return stage_transform(LeafStage(name="normalize_by_update_norm", update_leaf=leaf,
                                     prepare=prepare, needs_updates=True))


@jax.custom_vjp
def _scaled_backward(inputs: Any, scale: Any) -> Any:
    return inputs


def _scaled_backward_fwd(inputs: Any, scale: Any) -> tuple:
    return inputs, scale


def _scaled_backward_bwd(scale: Any, cotangents: Any) -> tuple:
    def one(c: Array) -> Array:
        if c.dtype == jax.dtypes.float0:
            return c
        return (c * scale).astype(c.dtype)
    return jax.tree_util.tree_map(one, cotangents), None


_scaled_backward.defvjp(_scaled_backward_fwd, _scaled_backward_bwd)


def scale_gradient(inputs: Any, scale: Any) -> Any:
    """The identity on ``inputs``, whose gradient is multiplied by ``scale`` going back.

    Forward, it returns ``inputs`` unchanged; in the backward pass the
    cotangent of every leaf is multiplied by ``scale`` (``scale=0`` stops the
    gradient, ``scale=1`` is a no-op, ``scale=-1`` reverses it, as a gradient
    reversal layer). ``scale`` may be traced; concrete 0 and 1 take the cheap
    paths (``stop_gradient`` / the inputs themselves).

    Args:
      inputs: a tree of arrays.
      scale: the factor for the gradient, a number or a scalar array.

    Returns:
      ``inputs`` (same values), with the backward pass scaled.

    >>> import jax, jax.numpy as jnp, functrain
    >>> jax.grad(lambda x: jnp.sum(functrain.scale_gradient(x, 0.5) ** 2))(jnp.array([1., 2.]))
    Array([1., 2.], dtype=float32)
    """
    value = concrete_real(scale)
    if value == 1.0:
        return inputs
    if value == 0.0:
        return jax.lax.stop_gradient(inputs)
    return _scaled_backward(inputs, scale)
