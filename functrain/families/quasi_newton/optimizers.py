"""Quasi-Newton named optimizers: L-BFGS with a line search.

``lbfgs`` chains :func:`~functrain.families.quasi_newton.lbfgs.scale_by_lbfgs`, a sign
flip (or a learning rate) and a line search from
:mod:`functrain.families.quasi_newton.linesearch`. Its ``update`` takes optax's extra
arguments (``value=``, ``grad=``, ``value_fn=``) and passes them to the search.
"""

from __future__ import annotations

from typing import Optional

from functrain.arg_checks import check_transformation
from functrain.declarations import declare_optimizer, hyperparameters
from functrain.engine.protocol import (GradientTransformation, GradientTransformationExtraArgs,
                                       ScalarOrSchedule)
from functrain.engine.program import chain, identity
from functrain.families.quasi_newton.lbfgs import scale_by_lbfgs
from functrain.families.quasi_newton.linesearch import scale_by_zoom_linesearch
from functrain.transforms.scaling import scale, scale_by_learning_rate


@declare_optimizer("optimizers", "Liu & Nocedal, 1989", optax="core", stressed=True, summary=(
    "L-BFGS (Nocedal, 1980; Liu & Nocedal, 1989): limited-memory quasi-Newton; pass `value=`, "
    "`grad=`, `value_fn=` to `update` (see `value_and_grad_from_state`)."), signature=(
    "lbfgs(learning_rate=None, memory_size=10, scale_init_precond=True, "
    "linesearch=scale_by_zoom_linesearch(20, initial_guess_strategy='one'))"))
@hyperparameters(learning_rate="schedule or None", memory_size="int")
def lbfgs(learning_rate: Optional[ScalarOrSchedule] = None, memory_size: int = 10,
          scale_init_precond: bool = True,
          linesearch: Optional[GradientTransformation] = scale_by_zoom_linesearch(
              max_linesearch_steps=20, initial_guess_strategy="one"),
          ) -> GradientTransformationExtraArgs:
    r"""L-BFGS: a limited-memory quasi-Newton method, with a zoom line search by default.

    Update rule: ``u = -eta_k * lr * P_k g`` where ``P_k`` is the L-BFGS
    inverse-Hessian approximation built from the last ``memory_size`` pairs of
    parameter and gradient differences (see
    :func:`~functrain.families.quasi_newton.lbfgs.scale_by_lbfgs`), ``lr`` is
    ``learning_rate`` (1 when ``None``) and ``eta_k`` the step size the line
    search finds (1 without one). The default search meets the strong Wolfe
    conditions (:func:`~functrain.families.quasi_newton.linesearch.scale_by_zoom_linesearch`,
    starting at 1 every step).

    References: Liu and Nocedal, 1989, "On the limited memory BFGS method for
    large scale optimization"; Nocedal and Wright, 1999, "Numerical
    Optimization", Algorithms 7.4 and 7.5.

    Best on deterministic objectives of small to medium size; with a line
    search, call ``update(grad, state, params, value=value, grad=grad,
    value_fn=f)`` and get ``value, grad`` from
    :func:`~functrain.families.quasi_newton.value_and_grad_reuse.value_and_grad_from_state` to reuse
    the search's last evaluation. Complex parameters are supported (pass
    ``conj`` of JAX's gradient, as for every optimizer).

    Args:
      learning_rate: an optional fixed or scheduled factor; ``None`` leaves the
        step size to the line search.
      memory_size: how many past pairs to keep (at least 1).
      scale_init_precond: start each two-loop recursion from a scaled identity.
      linesearch: a transformation choosing the step size (a line search such as
        :func:`scale_by_zoom_linesearch` or :func:`scale_by_backtracking_linesearch`),
        or ``None`` for none.

    Returns:
      A ``GradientTransformationExtraArgs``; its state is ``(ScaleByLBFGSState,
      EmptyState() or ScaleByScheduleState, the line search's state)``, as optax's.

    >>> import jax, jax.numpy as jnp, functrain
    >>> f = lambda w: jnp.sum(w ** 2)
    >>> opt = functrain.lbfgs()
    >>> w = jnp.array([1., 2., 3.])
    >>> state = opt.init(w)
    >>> value, grad = jax.value_and_grad(f)(w)
    >>> u, state = opt.update(grad, state, w, value=value, grad=grad, value_fn=f)
    >>> print(f"{f(w + u):.2f}")
    7.52
    """
    if linesearch is not None:
        check_transformation(linesearch, "lbfgs", "linesearch")
    step = scale(-1.0) if learning_rate is None else scale_by_learning_rate(learning_rate)
    tx = chain(scale_by_lbfgs(memory_size=memory_size, scale_init_precond=scale_init_precond),
               step, identity() if linesearch is None else linesearch)
    return GradientTransformationExtraArgs(tx.init, tx.update)


__all__ = ["lbfgs"]
