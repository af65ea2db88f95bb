"""Layer-wise scaling: each leaf's update scaled by a norm of that whole leaf.

The LARS/LAMB trust ratio, NovoGrad's per-leaf second moment, the
parameter-scale multipliers of Adafactor, and layer-wise DoG's step size. A
norm of one leaf is still one leaf's math, so all of these are engine stages
and fuse with their neighbours; the norms are per array, never over the whole
tree.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain.arg_checks import check_betas, check_nonnegative, check_range
from functrain.declarations import hyperparameters
from functrain import numerics
from functrain import tree as ft
from functrain.numerics import abs_sq, ema_update
from functrain.engine.protocol import EmptyState, GradientTransformation, MaskOrFn
from functrain.engine.stage import LeafChecks, LeafStage
from functrain.engine.counts import safe_increment, zero_count
from functrain.engine.program import stage_transform
from functrain.engine import recompute

Array = jax.Array

ScaleByTrustRatioState = EmptyState


class ScaleByNovogradState(NamedTuple):
    """State of :func:`scale_by_novograd`: count, momentum, per-leaf norm moment.

    ``nu`` holds one scalar per leaf (the EMA of its squared norm).

    Attributes:
      count: the number of steps taken (int32).
      mu: the momentum ``m``, a tree like the params (in ``mu_dtype`` if given).
      nu: one scalar per leaf: the moving average of the leaf's squared
        gradient norm.

    >>> import jax.numpy as jnp, functrain
    >>> functrain.scale_by_novograd().init({'w': jnp.ones(3)}).nu
    {'w': Array(0., dtype=float32)}
    """

    count: Array
    mu: Any
    nu: Any


@hyperparameters(min_norm="number", trust_coefficient="number", eps="number",
                 max_trust_ratio="bound or None")
def scale_by_trust_ratio(min_norm: float = 0.0, trust_coefficient: float = 1.0,
                         eps: float = 0.0, *, max_trust_ratio: Optional[float] = None,
                         mask: Optional[MaskOrFn] = None) -> GradientTransformation:
    """Scale each leaf's update by its trust ratio ``||p|| / ||u||`` (LARS/LAMB).

    Per array, never over the whole tree. ``max_trust_ratio`` (a cap) and
    ``mask`` (leaves where False keep their update unscaled) go beyond optax.

    The update is ``u * min(trust_coefficient ||p|| / (||u|| + eps),
    max_trust_ratio)``, with both norms floored at ``min_norm`` and the ratio 1
    where either norm is 0 (never NaN). ``update`` needs the params.
    Reference: You et al., 2017, "Large Batch Training of Convolutional Networks"
    (LARS); You et al., 2019, "Large Batch Optimization for Deep Learning:
    Training BERT in 76 minutes" (LAMB).

    Args:
      min_norm: the floor of both norms, ``>= 0`` (default 0: no floor).
      trust_coefficient: multiplies the ratio (LARS's ``eta``); default 1.
      eps: added to the update's norm in the denominator, ``>= 0``.
      max_trust_ratio: an upper bound on the ratio, ``>= 0``; ``None`` (default)
        for none.
      mask: which leaves to scale: ``None`` (default) for all, a tree of Python
        bools shaped like the params or a prefix of it, or a function of the
        params returning one. Leaves where it is False pass through unscaled.

    Returns:
      A ``GradientTransformation`` that keeps no state (``ScaleByTrustRatioState``,
      i.e. ``EmptyState``).

    >>> import jax.numpy as jnp
    >>> tx = scale_by_trust_ratio()
    >>> params = {'w': jnp.array([3., 4.])}
    >>> tx.update({'w': jnp.array([0., 1.])}, tx.init(params), params)[0]
    {'w': Array([0., 5.], dtype=float32)}
    """
    check_range("min_norm", min_norm, 0.0, owner="scale_by_trust_ratio")
    check_range("eps", eps, 0.0, owner="scale_by_trust_ratio")
    if max_trust_ratio is not None:
        check_range("max_trust_ratio", max_trust_ratio, 0.0, owner="scale_by_trust_ratio")

    def ratio(p: Array, y: Array) -> Array:
        return numerics.trust_ratio(p, y, trust_coefficient=trust_coefficient, eps=eps,
                                    min_norm=min_norm, max_trust_ratio=max_trust_ratio)

    # g * ratio(p, g); the CPU recompute may pass a second copy of g for the norm.
    return stage_transform(LeafStage(name="scale_by_trust_ratio",
                                     update_leaf=recompute.ScaledByNormOfInput(ratio), mask=mask,
                                     checks=LeafChecks(needs_params=True)))


@hyperparameters(b1="number", b2="number", eps="number", eps_root="number",
                 weight_decay="number")
def scale_by_novograd(b1: float = 0.9, b2: float = 0.25, eps: float = 1e-8,
                      eps_root: float = 0.0, weight_decay: float = 0.0,
                      mu_dtype: Optional[Any] = None) -> GradientTransformation:
    """Rescale with NovoGrad (Ginsburg et al., 2019): layer-wise second moments.

    Per leaf: ``nu = ema(||g||**2)`` (just ``||g||**2`` at the first step),
    ``m = b1 m + g / (sqrt(nu + eps_root) + eps) + weight_decay * p`` (no
    ``b1 m`` at the first step); the update is ``m``. The norm is of one
    leaf, so this is per-leaf math; ``nu`` is a scalar per leaf, so it is the
    stage's one field that is not params-shaped. Params are needed unless
    ``weight_decay`` is the number 0. Reference: Ginsburg et al., 2019,
    "Stochastic Gradient Methods with Layer-wise Adaptive Moments for Training of
    Deep Networks".

    Args:
      b1: the momentum coefficient of ``m``, in ``[0, 1)``.
      b2: decay rate of the per-leaf norm moment ``nu``, in ``[0, 1)``.
      eps: added to the denominator outside the square root, ``>= 0``.
      eps_root: added to ``nu`` inside the square root, ``>= 0`` (default 0).
      weight_decay: coefficient of ``p`` added to the normalised gradient before
        the momentum (default 0: none, and no params needed).
      mu_dtype: storage dtype of ``m``; ``None`` keeps each parameter's dtype.

    Returns:
      A ``GradientTransformation`` whose state is :class:`ScaleByNovogradState`.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_novograd(eps=0.0)
    >>> tx.update([jnp.array([3., 4.])], tx.init([jnp.zeros(2)]))[0]
    [Array([0.6, 0.8], dtype=float32)]
    """
    check_betas("scale_by_novograd", b1=b1, b2=b2)
    check_nonnegative("scale_by_novograd", eps=eps, eps_root=eps_root)
    decays = not (isinstance(weight_decay, (int, float)) and weight_decay == 0)

    def prepare(glob: dict, _: Any) -> tuple:
        count = safe_increment(glob["count"])
        return count == 1, {"count": count}

    def leaf(g: Array, s: tuple, p: Any, first: Array) -> tuple:
        sq = ft.leaf_norm(g) ** 2
        nu = jnp.where(first, sq, ema_update(sq, s.nu, b2))
        step = g / (jnp.sqrt(nu + eps_root) + eps)
        if decays:
            step = step + weight_decay * p
        mu = jnp.where(first, step, b1 * s.mu + step)
        return mu, s._replace(mu=mu, nu=nu)

    return stage_transform(LeafStage(
        name="scale_by_novograd", update_leaf=leaf, state_cls=ScaleByNovogradState,
        leaf_fields=("mu", "nu"),
        init_leaf=lambda p: (ft.zeros_like(p, mu_dtype), jnp.zeros([], p.dtype)),
        init_global=zero_count, prepare=prepare,
        checks=LeafChecks(needs_params=decays, shaped_fields=("mu",))))


def _safe_rms(x: Array, min_rms: Any) -> Array:
    rms = jnp.sqrt(jnp.mean(abs_sq(x)))
    return jnp.where(rms <= min_rms, min_rms, rms)


@hyperparameters(min_scale="number")
def scale_by_param_block_rms(min_scale: float = 1e-3) -> GradientTransformation:
    """Multiply each leaf's update by its parameter's RMS (at least ``min_scale``).

    The update is ``g * max(rms(p), min_scale)`` with ``rms(p) = sqrt(mean(p**2))``
    over the whole leaf; Adafactor's relative step size (Shazeer & Stern, 2018).
    ``update`` needs the params.

    Args:
      min_scale: the smallest factor, used where the parameter's RMS is at most
        it (e.g. zero-initialised params); ``>= 0``.

    Returns:
      A ``GradientTransformation`` that keeps no state.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_param_block_rms()
    >>> params = [jnp.array([3., -3.])]
    >>> tx.update([jnp.ones(2)], tx.init(params), params)[0]
    [Array([3., 3.], dtype=float32)]
    """
    check_range("min_scale", min_scale, 0.0, owner="scale_by_param_block_rms")
    return stage_transform(LeafStage(
        name="scale_by_param_block_rms", update_leaf=lambda g, s, p, c: (g * _safe_rms(p,
        min_scale), ()), checks=LeafChecks(needs_params=True)))


@hyperparameters(min_scale="number")
def scale_by_param_block_norm(min_scale: float = 1e-3) -> GradientTransformation:
    """Multiply each leaf's update by its parameter's L2 norm (at least ``min_scale``).

    The update is ``g * max(||p||, min_scale)``, ``||p||`` the norm of the whole
    leaf. ``update`` needs the params.

    Args:
      min_scale: the smallest factor, used where the parameter's norm is below it
        (e.g. zero-initialised params); ``>= 0``.

    Returns:
      A ``GradientTransformation`` that keeps no state.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_param_block_norm()
    >>> params = [jnp.array([3., 4.])]
    >>> tx.update([jnp.ones(2)], tx.init(params), params)[0]
    [Array([5., 5.], dtype=float32)]
    """
    check_range("min_scale", min_scale, 0.0, owner="scale_by_param_block_norm")
    return stage_transform(LeafStage(
        name="scale_by_param_block_norm",
        update_leaf=lambda g, s, p, c: (g * jnp.maximum(ft.leaf_norm(p), min_scale), ()),
        checks=LeafChecks(needs_params=True)))


# --------------------------------------------------------------------------
# Distance over gradients (layer-wise DoG)
# --------------------------------------------------------------------------

class ScaleByDistanceOverGradientsState(NamedTuple):
    """State of :func:`scale_by_distance_over_gradients` (optax's fields and shapes).

    Attributes:
      max_dist: one scalar per leaf: the largest distance of the parameters
        from their initial values so far (starting at ``reps_rel * (1 + ||p_0||)``).
      grad_sum_of_squares: one ``(1,)``-shaped array per leaf: the running sum of
        the leaf's squared gradient norms.
      init_params: the initial parameters (in ``param_dtype``).

    >>> import jax.numpy as jnp, functrain
    >>> functrain.scale_by_distance_over_gradients().init([jnp.ones(2)]).grad_sum_of_squares
    [Array([0.], dtype=float32)]
    """

    max_dist: Any
    grad_sum_of_squares: Any
    init_params: Any


@hyperparameters(reps_rel="number", eps="number", global_scale="number")
def scale_by_distance_over_gradients(reps_rel: float = 1e-6, eps: float = 1e-8,
                                     param_dtype: Optional[Any] = jnp.float32,
                                     global_scale: float = 1.0) -> GradientTransformation:
    """Layer-wise DoG: each leaf's step size is its distance travelled over its gradients.

    Per leaf: ``r = max(r, ||p - p_0||)`` (starting at ``reps_rel (1 + ||p_0||)``),
    ``G = G + ||g||**2``, and the update is ``global_scale * r / sqrt(G + eps) * g``;
    learning-rate free. This is "layer-wise DoG" (LDoG), the variant optax
    implements; the authors recommend averaging the iterates. Reference: Ivgi
    et al., 2023, "DoG is SGD's Best Friend: A Parameter-Free Dynamic Step Size
    Schedule". ``update`` needs the params. Unlike optax, a scalar leaf's update
    keeps shape ``()``. No complex version: complex leaves raise a ``TypeError``
    naming the leaf (the stored initial parameters are real).

    Args:
      reps_rel: sets the first step's distance ``reps_rel (1 + ||p_0||)``; the
        authors recommend 1e-6, or 1e-4 for models with batch normalization;
        ``>= 0``.
      eps: added to the sum of squared gradient norms, ``>= 0``.
      param_dtype: the dtype the initial parameters are stored in (default
        float32); ``None`` keeps each parameter's dtype.
      global_scale: multiplies every update (e.g. ``-1.0`` to descend when no
        learning-rate stage follows).

    Returns:
      A ``GradientTransformation`` whose state is
      :class:`ScaleByDistanceOverGradientsState`.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_distance_over_gradients(reps_rel=0.5, eps=0.0)
    >>> params = [jnp.array([3., 4.])]
    >>> tx.update([jnp.array([0., 2.])], tx.init(params), params)[0]
    [Array([0., 3.], dtype=float32)]
    """
    check_nonnegative("scale_by_distance_over_gradients", reps_rel=reps_rel, eps=eps)

    def init_leaf(p: Array) -> tuple:
        cd = ft.compute_dtype(p.dtype)
        first = reps_rel * (1 + jnp.sqrt(ft.sum_of_squares(p))).astype(cd)
        stored = p if param_dtype is None else p.astype(param_dtype)
        return first, jnp.zeros((1,), cd), stored

    def leaf(g: Array, s: Any, p: Array, ctx: Any) -> tuple:
        dist = jnp.maximum(s.max_dist, jnp.sqrt(jnp.sum(abs_sq(p - s.init_params))))
        g_sos = s.grad_sum_of_squares + jnp.sum(abs_sq(g))
        step = global_scale * dist / jnp.sqrt(g_sos + eps)
        return step.reshape(()) * g, s._replace(max_dist=dist, grad_sum_of_squares=g_sos)

    return stage_transform(LeafStage(
        name="scale_by_distance_over_gradients", update_leaf=leaf,
        state_cls=ScaleByDistanceOverGradientsState,
        leaf_fields=("max_dist", "grad_sum_of_squares", "init_params"), init_leaf=init_leaf,
        checks=LeafChecks(needs_params=True, shaped_fields=("init_params",), real_only=True)))
