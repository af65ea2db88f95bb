"""MARS-AdamW: AdamW on a variance-reduced, norm-clipped gradient (Yuan et al., 2024).

MARS ("Make vAriance Reduction Shine") adds a scaled gradient difference to the
gradient, a STORM-like variance-reduction term, clips the result to norm 1 and
feeds it to AdamW. Everything is per array, so ``scale_by_mars`` is one
:class:`~functrain.engine.stage.LeafStage` on functrain's engine; the step's
bias corrections are computed once per step by Adam's ``prepare``
(:func:`functrain.engine.counts.corrections`), and ``mars`` chains the stage
with decoupled weight decay and the learning rate (one fused pass).

Which variant: the paper (Algorithm 1) defines an *exact* correction
``g(x_t, xi_t) - g(x_{t-1}, xi_t)`` (two gradients of the same batch per step)
and an *approximate* one, ``g(x_t, xi_t) - g(x_{t-1}, xi_{t-1})``: the previous
step's gradient, so one gradient per step. The authors' reference code
(github.com/AGI-Arena/MARS, ``is_approx=True`` by default) and their GPT-2
results use the approximate variant, and it is the one a gradient
transformation can run, since it sees one gradient per step: this module
implements it. As in the reference, the previous gradient starts at zero, so
the first step uses ``c_1 = (1 + gamma b1 / (1 - b1)) g_1`` (clipped).

The clip is per array (per leaf), as the reference's ``torch.norm(c_t)`` of each
parameter tensor, not a global norm over the tree.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax

from functrain.arg_checks import check_betas, check_nonnegative, check_positive
from functrain.declarations import declare_optimizer, hyperparameters
from functrain import tree as ft
from functrain.numerics import abs_sq, adam_direction, ema_update, mars_corrected_gradient
from functrain.engine.counts import BiasCorrections, corrections, zero_count
from functrain.engine.protocol import GradientTransformation, MaskOrFn, ScalarOrSchedule
from functrain.engine.stage import LeafStage
from functrain.engine.program import chain, stage_transform
from functrain.transforms.scaling import add_decayed_weights, scale_by_learning_rate
from functrain.docstrings import shared_args

Array = jax.Array

__all__ = ["MarsState", "scale_by_mars", "mars"]


class MarsState(NamedTuple):
    """State of :func:`scale_by_mars`: Adam's moments of ``c`` and the previous gradient.

    Attributes:
      count: the number of steps taken (int32), for the bias corrections.
      mu: the moving average of the clipped corrected gradients ``c``.
      nu: the moving average of ``|c|**2``.
      prev_grad: the gradient of the previous step (zeros before the first).

    >>> import jax.numpy as jnp, functrain
    >>> state = functrain.contrib.scale_by_mars().init({'w': jnp.ones(2)})
    >>> state.prev_grad
    {'w': Array([0., 0.], dtype=float32)}
    """

    count: Array
    mu: Any
    nu: Any
    prev_grad: Any


@hyperparameters(b1="number", b2="number", eps="number", gamma="number",
                 max_norm="bound or None")
@shared_args()
def scale_by_mars(b1: float = 0.95, b2: float = 0.99, eps: float = 1e-8,
                  gamma: float = 0.025, max_norm: Optional[float] = 1.0,
                  mu_dtype: Optional[Any] = None) -> GradientTransformation:
    """Rescale updates by MARS-AdamW's moments (Yuan et al., 2024), approximate variant.

    Per leaf, with ``t`` the step counted from 1 and ``g_0 = 0``:

    - ``c = g_t + gamma * b1 / (1 - b1) * (g_t - g_{t-1})``;
    - ``c = c / ||c||`` when ``||c|| > max_norm`` (``max_norm = 1`` in the paper;
      precisely ``c * max_norm / ||c||``), the norm of this leaf alone;
    - ``mu = b1 mu + (1 - b1) c``, ``nu = b2 nu + (1 - b2) |c|**2``;
    - the update is ``(mu / (1 - b1**t)) / (sqrt(nu / (1 - b2**t)) + eps)``.

    With ``gamma = 0`` and ``||g|| <= max_norm`` this is exactly ``scale_by_adam``.
    Reference: Yuan, Liu, Wu, Zhou & Gu, 2024, "MARS: Unleashing the Power of
    Variance Reduction for Training Large Models" (arXiv:2411.10438),
    Algorithm 1 with the approximate gradient difference (see the module
    docstring for why that variant).

    Args:
      b1: decay of the first moment, in ``[0, 1)``; it also sets the weight
        ``b1 / (1 - b1)`` of the gradient difference. Default 0.95 (the
        paper's and the reference's).
      b2: decay of the second moment, in ``[0, 1)``. Default 0.99.
      eps: added to the denominator's square root, ``>= 0``. Default 1e-8.
      gamma: the strength of the variance reduction, ``>= 0`` (0 gives Adam
        on the clipped gradient). Default 0.025, the paper's tuned value for
        GPT-2.
      max_norm: ``c`` of a leaf is scaled down to this norm when longer; the
        paper uses 1. ``None`` (or ``inf``) turns the clipping off.
      <shared: mu_dtype>

    Returns:
      A ``GradientTransformation`` whose state is :class:`MarsState`.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.contrib.scale_by_mars(gamma=0.0)
    >>> params = [jnp.zeros(2)]
    >>> u, state = tx.update([jnp.array([0.3, -0.4])], tx.init(params))
    >>> print(u[0].round(4))
    [ 1. -1.]
    """
    check_betas("scale_by_mars", b1=b1, b2=b2)
    check_nonnegative("scale_by_mars", eps=eps, gamma=gamma)
    if max_norm is not None:
        check_positive("scale_by_mars", max_norm=max_norm)
    weight = gamma * b1 / (1 - b1)

    def leaf(g: Array, s: Any, p: Any, ctx: BiasCorrections) -> tuple:
        c = mars_corrected_gradient(g, s.prev_grad, weight, max_norm)
        mu, nu = ema_update(c, s.mu, b1), ema_update(abs_sq(c), s.nu, b2)
        return (adam_direction(mu / ctx.mu, nu, None, ctx.nu, eps, 0.0),
                s._replace(mu=mu, nu=nu, prev_grad=g))

    return stage_transform(LeafStage(
        name="scale_by_mars", update_leaf=leaf, state_cls=MarsState,
        leaf_fields=("mu", "nu", "prev_grad"),
        init_leaf=lambda p: (ft.zeros_like(p, mu_dtype), ft.zeros_like(p), ft.zeros_like(p)),
        init_global=zero_count, prepare=corrections(b1, b2)))


@declare_optimizer("beyond optax", "Yuan et al., 2024", optax=None, summary=(
    "MARS-AdamW (Yuan et al., 2024), approximate variant: AdamW on a variance-reduced, per-leaf "
    "clipped gradient."), signature="mars(learning_rate=3e-3, b1=0.95, b2=0.99, gamma=0.025, ...)")
@hyperparameters(learning_rate="schedule", b1="number", b2="number", eps="number",
                 gamma="number", weight_decay="schedule", max_norm="bound or None")
@shared_args()
def mars(learning_rate: ScalarOrSchedule = 3e-3, b1: float = 0.95, b2: float = 0.99,
         eps: float = 1e-8, gamma: float = 0.025, weight_decay: ScalarOrSchedule = 0.0,
         max_norm: Optional[float] = 1.0, mu_dtype: Optional[Any] = None,
         mask: Optional[MaskOrFn] = None, *,
         cautious_weight_decay: bool = False) -> GradientTransformation:
    """MARS-AdamW (Yuan et al., 2024): AdamW on a variance-reduced, clipped gradient.

    Update rule, per leaf (:func:`scale_by_mars`; ``g_0 = 0``, ``t`` from 1):
    ``c = g_t + gamma b1 / (1 - b1) (g_t - g_{t-1})``, clipped to norm
    ``max_norm`` (1); ``mu = b1 mu + (1 - b1) c``; ``nu = b2 nu + (1 - b2) c**2``;
    ``p -= lr * ((mu / (1 - b1**t)) / (sqrt(nu / (1 - b2**t)) + eps) + wd * p)``.
    This is the approximate variant (the previous step's gradient, one gradient
    per step), the default of the authors' reference code. Reference: Yuan,
    Liu, Wu, Zhou & Gu, 2024, "MARS: Unleashing the Power of Variance Reduction
    for Training Large Models" (arXiv:2411.10438).

    Defaults are the reference's (``lr = 3e-3``, ``b1 = 0.95``, ``b2 = 0.99``,
    ``gamma = 0.025``, ``eps = 1e-8``, ``weight_decay = 0``): the paper tuned
    them for GPT-2; the large ``b1`` is what makes the correction's weight
    ``gamma b1 / (1 - b1) = 0.475`` substantial. Unlike the reference, every leaf
    gets MARS: the reference sends leaves that are not 2-D to plain AdamW
    (``betas=(0.9, 0.95)``, ``weight_decay=0.1``) unless ``optimize_1d``; do
    that with ``functrain.multi_transform`` (example below).

    Args:
      learning_rate: the step size: a number or a schedule of the step count.
        Default 3e-3.
      b1: decay of the first moment, in ``[0, 1)``; also weights the
        correction. Default 0.95.
      b2: decay of the second moment, in ``[0, 1)``. Default 0.99.
      eps: added to the denominator's square root. Default 1e-8.
      gamma: strength of the variance reduction, ``>= 0``. Default 0.025.
      weight_decay: decoupled weight decay, multiplied by the learning rate
        (as ``adamw``). Default 0.
      max_norm: the per-leaf norm ``c`` is clipped to; default 1 (the
        paper's); ``None`` turns it off.
      mu_dtype: storage dtype of the first moment; ``None`` keeps the params'.
      mask: which leaves get weight decay (a tree of bools or a function of
        the params), as ``adamw``'s.
      <shared: cautious_weight_decay>

    Returns:
      A ``GradientTransformation``; its state is ``(MarsState, EmptyState,
      EmptyState)``.

    >>> import jax, jax.numpy as jnp, functrain
    >>> f = lambda p: jnp.sum((p['w'] - 1.0) ** 2) + jnp.sum(p['b'] ** 2)
    >>> opt = functrain.contrib.mars(learning_rate=0.1)
    >>> params = {'w': jnp.zeros((2, 2)), 'b': jnp.ones(2)}
    >>> state = opt.init(params)
    >>> for _ in range(20):
    ...     updates, state = opt.update(jax.grad(f)(params), state, params)
    ...     params = functrain.apply_updates(params, updates)
    >>> bool(f(params) < 1.0)
    True
    >>> # The reference's split: MARS for matrices, AdamW for the other leaves.
    >>> labels = lambda p: jax.tree_util.tree_map(
    ...     lambda x: 'mars' if x.ndim == 2 else 'adamw', p)
    >>> split = functrain.multi_transform(
    ...     {'mars': functrain.contrib.mars(3e-3),
    ...      'adamw': functrain.adamw(3e-3, b1=0.9, b2=0.95, weight_decay=0.1)}, labels)
    >>> _ = split.init(params)
    """
    return chain(scale_by_mars(b1, b2, eps, gamma, max_norm, mu_dtype),
                 add_decayed_weights(weight_decay, mask, cautious=cautious_weight_decay),
                 scale_by_learning_rate(learning_rate))
