"""Hyperball optimization: every hidden matrix kept on the sphere of its own norm (Wen et al.,
2025, "Fantastic Pretraining Optimizers and Where to Find Them 2.1: Hyperball Optimization").

Weight decay mostly serves to hold each weight's norm, which in turn sets how far a step moves
the weight relative to its size. Hyperball optimization fixes both directly: the step is the
base optimizer's direction normalized to the weight's norm times the learning rate, and the
stepped weight is projected back onto the sphere of the norm it had,
``W <- Norm(W - lr * ||W|| * Norm(u)) * ||W||`` with ``Norm(x) = x / ||x||_F``, per matrix.
``muonh`` uses Muon's orthogonalized momentum as ``u`` (MuonH), ``adamh`` Adam's direction
(AdamH); the other leaves (biases, gains, and any leaf the dimension numbers leave out) get
AdamW, as in Levanter's ``muonh``/``adamh`` and modded-nanogpt's optimizer track, where MuonH
and its NorMuon and SOAP variants set several records. optax has none of these.

What the params must be: each hyperball matrix needs a nonzero norm at initialization (the
norm it keeps for the whole run, up to rounding). A zero-initialized matrix has no direction
and stays zero; give such leaves to the AdamW side (dimension numbers ``None``), or initialize
them small but nonzero. The learning rate is relative: ``lr = 0.02`` moves each matrix by 2%
of its norm per step, whatever its size. No weight decay on the hyperball leaves (their norm
is fixed); ``adam_weight_decay`` for the others.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain.arg_checks import check_betas, check_nonnegative
from functrain.declarations import declare_optimizer, hyperparameters
from functrain.families.muon.muon import (check_options, per_dims, resolve_coeffs, scale_by_muon,
                                          split_muon_adam)
from functrain.matrix.dimension_numbers import MuonDimensionNumbers, leaf_axes
from functrain.engine.program import chain
from functrain.engine.protocol import GradientTransformation, ScalarOrSchedule
from functrain.engine.stage import LeafChecks, LeafStage
from functrain.engine.counts import safe_increment, zero_count
from functrain.families.adam.optimizers import adamw
from functrain.families.adam.stages import scale_by_adam

Array = jax.Array

__all__ = ["ScaleByHyperballState", "scale_by_hyperball", "hyperball_step", "muonh", "adamh"]


class ScaleByHyperballState(NamedTuple):
    """State of :func:`scale_by_hyperball` with a learning-rate schedule: the step count.

    Attributes:
      count: the number of steps taken (int32); the schedule is evaluated at it.

    >>> import jax.numpy as jnp
    >>> scale_by_hyperball(lambda c: 0.02).init({'w': jnp.ones((2, 2))})
    ScaleByHyperballState(count=Array(0, dtype=int32))
    """

    count: Array


def hyperball_step(p: Array, u: Array, learning_rate: Any, axes: tuple) -> Array:
    """The hyperball update of ``p`` along ``u``: ``Norm(p - lr ||p|| Norm(u)) ||p|| - p``.

    Norms are Frobenius norms over ``axes`` (one matrix's axes; the others index a stack of
    matrices, each on its own sphere). A zero ``u`` gives a zero update; a zero ``p`` stays
    zero.

    Args:
      p: the params (a matrix, or a stack of them).
      u: the base optimizer's direction, shaped like ``p`` (the descent direction: the
        update moves ``p`` against it).
      learning_rate: the step as a fraction of the norm.
      axes: the axes of one matrix.

    Returns:
      The update, in the dtype of the computation (``p`` plus it has ``p``'s norm).

    >>> import jax.numpy as jnp
    >>> p = jnp.array([[3.0, 4.0]])
    >>> u = hyperball_step(p, jnp.array([[1.0, 0.0]]), 0.1, (0, 1))
    >>> float(jnp.linalg.norm(p + u))
    5.0
    """
    def inner(x: Array, y: Array) -> Array:
        return jnp.sum(jnp.real(x * jnp.conj(y)), axis=axes, keepdims=True)

    # Written as p (s - 1) - s lr R n with s = R / ||moved|| and s - 1 from the small
    # quantity R^2 - ||moved||^2 = 2 lr R <p, n> - (lr R)^2: the update is accurate relative
    # to its own size, not to the params' (a difference moved * s - p would carry the
    # params' rounding into every small step).
    tiny = jnp.finfo(jnp.result_type(p, u)).tiny
    radius = jnp.sqrt(inner(p, p))
    length = jnp.sqrt(inner(u, u))
    n = u / jnp.maximum(length, tiny)
    step = jnp.where(length > 0, learning_rate * radius, 0)  # no direction: no step
    shrink = 2 * step * inner(p, n) - step * step  # R^2 - ||moved||^2
    moved = jnp.sqrt(jnp.maximum(radius * radius - shrink, 0))
    s = radius / jnp.maximum(moved, tiny)
    s_minus_1 = shrink / jnp.maximum(jnp.maximum(moved, tiny) * (radius + moved), tiny)
    return p * s_minus_1 - (s * step) * n


@hyperparameters(learning_rate="schedule")
def scale_by_hyperball(learning_rate: ScalarOrSchedule,
                       weight_dimension_numbers: Any = None) -> GradientTransformation:
    """Turn a direction into a step on each matrix's sphere (hyperball optimization).

    The update of each matrix ``W`` with incoming direction ``u`` is
    ``Norm(W - lr ||W|| Norm(u)) ||W|| - W`` (:func:`hyperball_step`): the learning rate is
    the step's size relative to the weight's norm, and the norm never changes. This stage
    replaces ``scale_by_learning_rate`` at the end of a chain; ``update`` needs the params.
    Reference: Wen, Dang, Lyu, Ma & Liang, 2025, "Fantastic Pretraining Optimizers and Where
    to Find Them 2.1: Hyperball Optimization".

    Args:
      learning_rate: the step relative to the norm, a number or a schedule of the step count.
      weight_dimension_numbers: which axes form each matrix, as Muon's
        (:class:`~functrain.contrib.MuonDimensionNumbers`: one for all leaves, a tree of them,
        or a function of the params); ``None``: ``MuonDimensionNumbers()``, each leaf one
        matrix of its axes 0 and 1 (for a 2-D leaf: the whole leaf).

    Returns:
      A ``GradientTransformation``: stateless (``EmptyState``) for a fixed rate,
      :class:`ScaleByHyperballState` for a schedule.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_hyperball(0.1)
    >>> params = {'w': jnp.array([[3.0, 4.0]])}
    >>> u, _ = tx.update({'w': jnp.array([[1.0, 0.0]])}, tx.init(params), params)
    >>> round(float(jnp.linalg.norm(params['w'] + u['w'])), 5)
    5.0
    """
    return matrix_step_stage(
        "scale_by_hyperball", learning_rate, weight_dimension_numbers, ScaleByHyperballState,
        lambda p, u, lr, red, out: hyperball_step(p.astype(u.dtype), u, lr,
                                                  tuple(sorted(red + out))))


def matrix_step_stage(owner: str, learning_rate: ScalarOrSchedule, weight_dimension_numbers: Any,
                      state_cls: type, step: Any) -> GradientTransformation:
    """A chain's last stage that turns each matrix's direction into its update, ``update = step(p,
    u, lr, reduction_axes, output_axes)``, at a fixed or scheduled learning rate.

    The scaffold of :func:`scale_by_hyperball` and
    :func:`~functrain.contrib.scale_by_radius_pin`.

    Args:
      owner: the stage's name (in errors).
      learning_rate: a number, or a schedule of the step count.
      weight_dimension_numbers: Muon's dimension numbers (``None``: ``MuonDimensionNumbers()``).
      state_cls: the state with a schedule: a ``NamedTuple`` with one field, ``count``.
      step: ``step(params, direction, lr, reduction_axes, output_axes) -> update``.

    Returns:
      A ``GradientTransformation``: stateless for a fixed rate, ``state_cls`` for a schedule.

    >>> import jax.numpy as jnp
    >>> tx = matrix_step_stage('double', 0.5, None, ScaleByHyperballState,
    ...                        lambda p, u, lr, red, out: -lr * 2 * u)
    >>> tx.update({'w': jnp.ones((2, 2))}, tx.init({'w': jnp.ones((2, 2))}),
    ...           {'w': jnp.ones((2, 2))})[0]['w'].tolist()
    [[-1.0, -1.0], [-1.0, -1.0]]
    """
    scheduled = callable(learning_rate)

    def build(dims: MuonDimensionNumbers) -> LeafStage:
        def leaf(g: Array, s: Any, p: Any, lr: Any) -> tuple:
            red, out = leaf_axes(dims, g.shape, f"of shape {g.shape}", owner)
            update = step(p, g, lr if scheduled else learning_rate, red, out)
            return update.astype(g.dtype), ()

        if not scheduled:
            return LeafStage(name=owner, update_leaf=leaf, checks=LeafChecks(needs_params=True))

        def prepare(glob: dict, _: Any) -> tuple:
            return learning_rate(glob["count"]), {"count": safe_increment(glob["count"])}

        return LeafStage(name=owner, update_leaf=leaf, state_cls=state_cls,
                         leaf_fields=(), init_leaf=lambda p: (), init_global=zero_count,
                         prepare=prepare, checks=LeafChecks(needs_params=True))

    return per_dims(weight_dimension_numbers, build, owner, "weight_dimension_numbers")


@declare_optimizer("beyond optax", "Wen et al., 2025", optax=None, stressed=True, summary=(
    "MuonH (Wen et al., 2025): Muon's orthogonalized momentum as a step of `lr` times each "
    "matrix's norm, projected back onto that norm (hyperball); AdamW on the other leaves."),
    signature="muonh(learning_rate=0.02, ns_coeffs='standard', ns_steps=5, beta=0.95, ...)")
@hyperparameters(static=("mesh", "ns_dtype"), learning_rate="schedule", ns_steps="int",
                 beta="number", eps="number", adam_b1="number", adam_b2="decay",
                 adam_eps_root="number", adam_weight_decay="schedule",
                 adam_learning_rate="schedule or None")
def muonh(learning_rate: ScalarOrSchedule = 0.02, ns_coeffs: Any = "standard",
          ns_steps: int = 5, beta: float = 0.95, eps: float = 1e-8,
          mu_dtype: Optional[Any] = None, *, nesterov: bool = True, adam_b1: float = 0.9,
          adam_b2: float = 0.999, adam_eps_root: float = 0.0,
          adam_weight_decay: ScalarOrSchedule = 0.0,
          adam_learning_rate: Optional[ScalarOrSchedule] = None,
          muon_weight_dimension_numbers: Any = None,
          mesh: Optional[jax.sharding.Mesh] = None, ns_method: str = "standard",
          ns_dtype: Optional[Any] = None) -> GradientTransformation:
    """MuonH: Muon's direction on the hyperball (Wen et al., 2025); AdamW for other leaves.

    Update rule for a matrix ``W`` (see :class:`~functrain.contrib.MuonDimensionNumbers`):
    ``O`` = :func:`~functrain.contrib.scale_by_muon`'s orthogonalized momentum, then
    ``W <- Norm(W - lr ||W|| Norm(O)) ||W||`` (:func:`scale_by_hyperball`; Muon's shape
    scale is a number per matrix, which the normalization removes). Every matrix keeps its
    initial norm, so it must start nonzero (module docstring). Other leaves:
    ``adamw(adam_learning_rate, adam_b1, adam_b2, eps, adam_eps_root,
    weight_decay=adam_weight_decay, nesterov=nesterov)``, as :func:`~functrain.contrib.muon`.
    Reference: Wen, Dang, Lyu, Ma & Liang, 2025, "Fantastic Pretraining Optimizers and Where
    to Find Them 2.1: Hyperball Optimization"; Levanter's ``muonh``.

    Args:
      learning_rate: the step relative to each matrix's norm (a number or a schedule).
      ns_coeffs: Newton-Schulz coefficients, as :func:`~functrain.contrib.muon`'s.
      ns_steps: Newton-Schulz iterations.
      beta: Muon's momentum decay, in ``[0, 1)``.
      eps: Newton-Schulz's normalization epsilon and the AdamW side's ``eps``.
      mu_dtype: storage dtype of the momenta.
      nesterov: Nesterov momentum (both sides), default ``True``.
      adam_b1: the AdamW side's first-moment decay, in ``[0, 1)``.
      adam_b2: the AdamW side's second-moment decay, in ``[0, 1)``.
      adam_eps_root: the AdamW side's ``eps_root``.
      adam_weight_decay: the AdamW side's decoupled weight decay (the hyperball side has
        none: its norms are fixed).
      adam_learning_rate: the AdamW side's learning rate (a number or schedule; ``None``:
        ``learning_rate``, which is relative on the hyperball side and absolute here, so
        they usually differ).
      muon_weight_dimension_numbers: which leaves are hyperball matrices and their axes, as
        :func:`~functrain.contrib.muon`'s (``None``: the 2-D leaves).
      mesh: as :func:`~functrain.contrib.muon`'s (Newton-Schulz over a device mesh).
      ns_method: ``'standard'`` or ``'gram'``, as :func:`~functrain.contrib.muon`'s.
      ns_dtype: Newton-Schulz's dtype, as :func:`~functrain.contrib.muon`'s.

    Returns:
      A ``GradientTransformation``: optax's ``partition`` state with entries ``'muon'``
      (the hyperball side) and ``'adam'``, as :func:`~functrain.contrib.muon`'s.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.muonh(0.1)
    >>> params = {'w': jnp.ones((4, 3)), 'b': jnp.zeros(3)}
    >>> u, _ = opt.update({'w': jnp.eye(4, 3), 'b': jnp.ones(3)}, opt.init(params), params)
    >>> round(float(jnp.linalg.norm(params['w'] + u['w'])), 4)  # = ||W|| = sqrt(12)
    3.4641
    """
    owner = "muonh"
    check_betas(owner, beta=beta, adam_b1=adam_b1, adam_b2=adam_b2)
    check_nonnegative(owner, eps=eps, adam_eps_root=adam_eps_root)
    check_options(owner, ns_steps, "frobenius", ns_method, ns_dtype)
    resolve_coeffs(ns_coeffs, ns_steps, owner)
    spec = (MuonDimensionNumbers() if muon_weight_dimension_numbers is None
            else muon_weight_dimension_numbers)
    hyperball = chain(scale_by_muon(ns_coeffs, ns_steps, beta, eps, mu_dtype, nesterov=nesterov,
                                    weight_dimension_numbers=spec, mesh=mesh,
                                    ns_method=ns_method, ns_dtype=ns_dtype),
                      scale_by_hyperball(learning_rate, spec))
    adam_tx = adamw(learning_rate if adam_learning_rate is None else adam_learning_rate,
                    b1=adam_b1, b2=adam_b2, eps=eps, eps_root=adam_eps_root, mu_dtype=mu_dtype,
                    weight_decay=adam_weight_decay, nesterov=nesterov)
    return split_muon_adam(hyperball, adam_tx, muon_weight_dimension_numbers)


@declare_optimizer("beyond optax", "Wen et al., 2025", optax=None, summary=(
    "AdamH (Wen et al., 2025): Adam's direction as a step of `lr` times each matrix's norm, "
    "projected back onto that norm (hyperball); AdamW on the other leaves."),
    signature="adamh(learning_rate=0.02, b1=0.9, b2=0.999, eps=1e-8, ...)")
@hyperparameters(learning_rate="schedule", b1="number", b2="decay", eps="number",
                 eps_root="number", adam_b1="number", adam_b2="decay", adam_eps_root="number",
                 adam_weight_decay="schedule", adam_learning_rate="schedule or None")
def adamh(learning_rate: ScalarOrSchedule = 0.02, b1: float = 0.9, b2: float = 0.999,
          eps: float = 1e-8, eps_root: float = 0.0, mu_dtype: Optional[Any] = None, *,
          adam_b1: float = 0.9, adam_b2: float = 0.999, adam_eps_root: float = 0.0,
          adam_weight_decay: ScalarOrSchedule = 0.0,
          adam_learning_rate: Optional[ScalarOrSchedule] = None,
          weight_dimension_numbers: Any = None) -> GradientTransformation:
    """AdamH: Adam's direction on the hyperball (Wen et al., 2025); AdamW for other leaves.

    Update rule for a matrix ``W``: ``u = m_hat / (sqrt(v_hat + eps_root) + eps)`` (Adam's
    bias-corrected direction), then ``W <- Norm(W - lr ||W|| Norm(u)) ||W||``
    (:func:`scale_by_hyperball`). Every matrix keeps its initial norm, so it must start
    nonzero (module docstring). Other leaves: ``adamw(adam_learning_rate, adam_b1, adam_b2,
    eps, adam_eps_root, weight_decay=adam_weight_decay)``. Reference: Wen, Dang, Lyu, Ma &
    Liang, 2025, "Fantastic Pretraining Optimizers and Where to Find Them 2.1: Hyperball
    Optimization"; Levanter's ``adamh``.

    Args:
      learning_rate: the step relative to each matrix's norm (a number or a schedule).
      b1: the hyperball side's first-moment decay, in ``[0, 1)``.
      b2: the hyperball side's second-moment decay, in ``[0, 1)``.
      eps: added to the root of the second moment (both sides).
      eps_root: added inside that root on the hyperball side.
      mu_dtype: storage dtype of the first moments.
      adam_b1: the AdamW side's first-moment decay, in ``[0, 1)``.
      adam_b2: the AdamW side's second-moment decay, in ``[0, 1)``.
      adam_eps_root: the AdamW side's ``eps_root``.
      adam_weight_decay: the AdamW side's decoupled weight decay (the hyperball side has
        none: its norms are fixed).
      adam_learning_rate: the AdamW side's learning rate (a number or schedule; ``None``:
        ``learning_rate``, which is relative on the hyperball side and absolute here, so
        they usually differ).
      weight_dimension_numbers: which leaves are hyperball matrices and their axes, as
        :func:`~functrain.contrib.muon`'s ``muon_weight_dimension_numbers`` (``None``: the
        2-D leaves; stacked layers ``(L, m, n)`` with ``MuonDimensionNumbers(-2, -1)``).

    Returns:
      A ``GradientTransformation``: optax's ``partition`` state with entries ``'muon'``
      (the hyperball side) and ``'adam'``, as :func:`~functrain.contrib.muon`'s.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.adamh(0.1)
    >>> params = {'w': jnp.ones((4, 3)), 'b': jnp.zeros(3)}
    >>> u, _ = opt.update({'w': jnp.eye(4, 3), 'b': jnp.ones(3)}, opt.init(params), params)
    >>> round(float(jnp.linalg.norm(params['w'] + u['w'])), 4)  # = ||W|| = sqrt(12)
    3.4641
    """
    owner = "adamh"
    check_betas(owner, b1=b1, b2=b2, adam_b1=adam_b1, adam_b2=adam_b2)
    check_nonnegative(owner, eps=eps, eps_root=eps_root, adam_eps_root=adam_eps_root)
    spec = (MuonDimensionNumbers() if weight_dimension_numbers is None
            else weight_dimension_numbers)
    hyperball = chain(scale_by_adam(b1, b2, eps, eps_root, mu_dtype),
                      scale_by_hyperball(learning_rate, spec))
    adam_tx = adamw(learning_rate if adam_learning_rate is None else adam_learning_rate,
                    b1=adam_b1, b2=adam_b2, eps=eps, eps_root=adam_eps_root, mu_dtype=mu_dtype,
                    weight_decay=adam_weight_decay)
    return split_muon_adam(hyperball, adam_tx, weight_dimension_numbers)
