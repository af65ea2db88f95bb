"""``split_real_and_imaginary``: run a real-valued optimizer on complex parameters.

Each complex leaf is split into a pair of real arrays (its real and imaginary
parts, a :class:`SplitRealAndImaginaryArrays` node) before the wrapped
transformation sees it, and the pair of transformed real updates is merged
back into one complex update afterwards: the optimizer treats ``z = x + iy`` as
the two real parameters ``x`` and ``y``. Real leaves pass through as they are.
The wrapped transformation's stages still run fused, on the split tree.

JAX's gradient of a real loss in a complex parameter is the conjugate of the
steepest-ascent direction (optax issue 196): conjugate it (``jnp.conj``)
between ``jax.grad`` and ``update``.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain.arg_checks import check_state_type, check_transformation
from functrain.declarations import declare_optimizer, hyperparameters
from functrain.engine.protocol import GradientTransformation, Params, Updates, call_update

Array = jax.Array

__all__ = ["SplitRealAndImaginaryArrays", "SplitRealAndImaginaryState",
           "split_real_and_imaginary"]


class SplitRealAndImaginaryArrays(NamedTuple):
    """The two real arrays a complex leaf is split into (optax's node type).

    Attributes:
      real: the real part.
      imaginary: the imaginary part.

    >>> import jax.numpy as jnp
    >>> SplitRealAndImaginaryArrays(jnp.ones(1), jnp.zeros(1)).imaginary
    Array([0.], dtype=float32)
    """

    real: Any
    imaginary: Any


class SplitRealAndImaginaryState(NamedTuple):
    """State of :func:`split_real_and_imaginary`: the wrapped transformation's state.

    Attributes:
      inner_state: the inner state, made for the split (real) parameters.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.contrib.split_real_and_imaginary(functrain.scale_by_adam())
    >>> tx.init({'z': jnp.ones(2, jnp.complex64)}).inner_state.mu['z'].real
    Array([0., 0.], dtype=float32)
    """

    inner_state: Any


def _split(x: Any) -> Any:
    """A complex array as a pair of real ones; anything else as it is."""
    if x is not None and jnp.iscomplexobj(x):
        x = jnp.asarray(x)
        return SplitRealAndImaginaryArrays(jnp.real(x), jnp.imag(x))
    return x


def _merge(x: Any) -> Any:
    """A pair of real arrays back as one complex array; anything else as it is."""
    if isinstance(x, SplitRealAndImaginaryArrays):
        return jax.lax.complex(x.real, x.imaginary)
    return x


def _split_tree(tree: Any) -> Any:
    return jax.tree_util.tree_map(_split, tree)


@declare_optimizer("contrib", "optax.contrib.split_real_and_imaginary (no paper)", optax="contrib",
    listed_with="normalize")
@hyperparameters()  # none of its own: current_hyperparams reports the inner optimizer's
def split_real_and_imaginary(inner: GradientTransformation) -> GradientTransformation:
    """Run ``inner`` on the real and imaginary parts of complex leaves as separate reals.

    A complex leaf ``z`` reaches ``inner`` as ``SplitRealAndImaginaryArrays(real=
    z.real, imaginary=z.imag)`` (params and updates alike), and ``inner`` 's two
    real updates ``(a, b)`` come back as ``a + ib``. Real leaves pass through
    unchanged, so mixed trees work. This makes optimizers whose math has no
    complex version (``sign``, clipping, ...) usable on complex parameters,
    and gives any optimizer the "two real parameters" behaviour.

    Args:
      inner: the transformation to wrap (functrain's, optax's, or any object
        with ``init`` and ``update``).

    Returns:
      A ``GradientTransformation`` whose state is
      :class:`SplitRealAndImaginaryState`. Extra ``update`` keywords are passed
      on to ``inner`` when it takes them.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.contrib.split_real_and_imaginary(functrain.sign_sgd(1.0))
    >>> params = {'z': jnp.zeros(1, jnp.complex64)}
    >>> tx.update({'z': jnp.array([2 - 3j], jnp.complex64)}, tx.init(params), params)[0]
    {'z': Array([-1.+1.j], dtype=complex64)}
    """
    check_transformation(inner, "split_real_and_imaginary")

    def init_fn(params: Params) -> SplitRealAndImaginaryState:
        return SplitRealAndImaginaryState(inner.init(_split_tree(params)))

    def update_fn(updates: Updates, state: SplitRealAndImaginaryState,
                  params: Optional[Params] = None, **extra_args: Any
                  ) -> tuple[Updates, SplitRealAndImaginaryState]:
        check_state_type(state, SplitRealAndImaginaryState, "split_real_and_imaginary")
        split_params = None if params is None else _split_tree(params)
        new_updates, inner_state = call_update(inner, _split_tree(updates), state.inner_state,
                                               split_params, extra_args)
        merged = jax.tree_util.tree_map(
            _merge, new_updates,
            is_leaf=lambda x: isinstance(x, SplitRealAndImaginaryArrays))
        return merged, SplitRealAndImaginaryState(inner_state)

    return GradientTransformation(init_fn, update_fn)
