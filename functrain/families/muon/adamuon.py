"""AdaMuon: an element-wise second moment on Muon's orthogonalized update (Si et al., 2025).

AdaMuon orthogonalizes the sign of the momentum (the "sign-stabilized" update), keeps an
Adam-like moving average of each entry's squared orthogonalized update, divides by its
root, and rescales each matrix to Adam's update RMS of 0.2, so AdamW's learning rates and
schedules carry over. optax does not have it. It is built from Muon's pieces in
:mod:`functrain.families.muon.muon`: the same dimension numbers, the same batched Newton-Schulz
over the tree (``ns_coeffs``, ``ns_steps``, ``ns_method``, ``mesh``) and the same split that
sends the other leaves to AdamW.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain import tree as ft
from functrain.arg_checks import check_betas, check_nonnegative, check_range, check_state_type
from functrain.declarations import declare_optimizer, hyperparameters, state_value_kinds
from functrain.families.muon.muon import (check_options, in_compute_dtype, orthogonalize_tree,
                                          per_dims, resolve_coeffs, muon_family)
from functrain.matrix.dimension_numbers import MuonDimensionNumbers, dims_of_leaves, leaf_axes
from functrain.numerics import abs_sq, ema_update
from functrain.families.adam.optimizers import adamw
from functrain.engine.protocol import (GradientTransformation, MaskOrFn, Params, ScalarOrSchedule,
                                       Updates)
from functrain.engine.stage import LeafStage
from functrain.docstrings import shared_args

Array = jax.Array

__all__ = ["AdaMuonState", "scale_by_adamuon", "adamuon"]

# The official code's Newton-Schulz input scaling, X / (||X||_F + 1e-7).
NS_EPS = 1e-7
# The update RMS AdaMuon aligns to: Adam's typical one.
TARGET_RMS = 0.2


@state_value_kinds(mu="signed", nu="unsigned")
class AdaMuonState(NamedTuple):
    """State of :func:`scale_by_adamuon`: the momentum and the element-wise second moment.

    Attributes:
      mu: the momentum, a tree like the params.
      nu: the moving average of the squared orthogonalized update, a tree like the params.

    >>> import jax.numpy as jnp
    >>> scale_by_adamuon().init({'w': jnp.zeros((2, 3))}).nu['w'].shape
    (2, 3)
    """

    mu: Any
    nu: Any


@hyperparameters(static=("mesh", "ns_dtype"), beta="number", beta2="number or None", eps="number",
                 ns_steps="int")
@shared_args()
def scale_by_adamuon(beta: float = 0.95, beta2: Optional[float] = None, eps: float = 1e-8,
                     ns_coeffs: Any = "standard", ns_steps: int = 5,
                     mu_dtype: Optional[Any] = None, *, nesterov: bool = True,
                     weight_dimension_numbers: Any = None,
                     mesh: Optional[jax.sharding.Mesh] = None, ns_method: str = "standard",
                     ns_dtype: Optional[Any] = None
                     ) -> GradientTransformation:
    """Rescale updates by AdaMuon's rule (Si, Zhang & Shen, 2025).

    Update rule, per leaf (the paper's Algorithm 1 as the official code runs it):
    ``mu = beta mu + (1 - beta) g``; ``m = beta mu + (1 - beta) g`` (Nesterov, the code's
    default; else ``m = mu``); each matrix ``M`` of ``m`` (see
    :class:`MuonDimensionNumbers`) becomes ``O = NS(S / (||S||_F + 1e-7))`` with ``S =
    sign(M)`` (the sign-stabilized update; ``M / |M|`` for complex entries) and Muon's
    Newton-Schulz iteration ``NS``; ``nu = beta2 nu + (1 - beta2) |O|**2`` (no bias
    correction: the rescaling cancels it); ``O' = O / (sqrt(nu) + eps)``; and the update
    is ``O' * 0.2 sqrt(m n) / (||O'||_F + eps)`` for an ``m x n`` matrix (its RMS is 0.2,
    Adam's).

    Reference: Si, Zhang & Shen, 2025, "AdaMuon: Adaptive Muon Optimizer"
    (arXiv:2507.11005); official code github.com/Chongjie-Si/AdaMuon (its defaults:
    ``beta = 0.95``, ``beta2 = beta``, ``eps = 1e-8``).

    Args:
      beta: the momentum's decay rate, in ``[0, 1)``.
      beta2: the second moment's decay rate, in ``[0, 1)``; ``None`` (the official code's
        choice): ``beta``.
      eps: added to ``sqrt(nu)`` and to the norm in the rescaling, ``>= 0``.
      ns_coeffs: Newton-Schulz coefficients, as :func:`functrain.contrib.scale_by_muon`
        takes them: a triple, one triple per step, or a preset's name (``'standard'``).
      <shared: ns_steps, mu_dtype>
      nesterov: use Nesterov's look-ahead ``beta mu + (1 - beta) g`` (default ``True``).
      weight_dimension_numbers: the matrix axes of each leaf, as
        :func:`functrain.contrib.scale_by_muon` takes them (``None``: the last two axes).
      mesh: divide Newton-Schulz over this mesh's devices, as ``scale_by_muon(mesh=)``.
      ns_method: ``'standard'`` or ``'gram'``, as ``scale_by_muon(ns_method=)``: the same
        iteration through ``M M^H`` (fewer flops for wide matrices); needs a static ``ns_steps``.
      ns_dtype: the dtype Newton-Schulz runs in, e.g. ``jnp.bfloat16`` (beyond optax), as
        ``scale_by_muon(ns_dtype=)``; ``None``: the updates'.

    Returns:
      A ``GradientTransformation`` whose state is :class:`AdaMuonState`.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_adamuon()
    >>> g = {'w': jnp.array([[3., 0.], [0., 4.]])}
    >>> u, state = tx.update(g, tx.init(g))
    >>> round(float(jnp.sqrt(jnp.mean(u['w'] ** 2))), 4)  # RMS-aligned to Adam's 0.2
    0.2
    """
    owner = "scale_by_adamuon"
    name = "weight_dimension_numbers"
    decay2 = beta if beta2 is None else beta2
    check_betas(owner, beta=beta, beta2=decay2)
    check_nonnegative(owner, eps=eps)
    check_options(owner, ns_steps, "frobenius", ns_method, ns_dtype)
    coeffs, safety = resolve_coeffs(ns_coeffs, ns_steps, owner)

    def stage(leaf: Any) -> LeafStage:
        return LeafStage(name=owner, update_leaf=leaf, state_cls=AdaMuonState,
                         leaf_fields=("mu", "nu"),
                         init_leaf=lambda p: (ft.zeros_like(p, mu_dtype), ft.zeros_like(p)))

    def momentum_stage(dims: MuonDimensionNumbers) -> LeafStage:
        def leaf(g: Array, s: Any, p: Any, ctx: Any) -> tuple:
            mu = ema_update(g, s.mu, beta)
            return jnp.sign(ema_update(g, mu, beta) if nesterov else mu), s._replace(mu=mu)
        return stage(leaf)

    def normalize_stage(dims: MuonDimensionNumbers) -> LeafStage:
        def leaf(o: Array, s: Any, p: Any, ctx: Any) -> tuple:
            red, out = leaf_axes(dims, o.shape, f"of shape {o.shape}", owner)
            nu = ema_update(abs_sq(o), s.nu, decay2)
            o = o / (jnp.sqrt(nu) + eps)
            norm = jnp.sqrt(jnp.sum(abs_sq(o), axis=red + out, keepdims=True))
            size = math.prod(o.shape[a] for a in red + out)
            return o * (TARGET_RMS * math.sqrt(size) / (norm + eps)), s._replace(nu=nu)
        return stage(leaf)

    momentum = per_dims(weight_dimension_numbers, momentum_stage, owner, name)
    normalize = per_dims(weight_dimension_numbers, normalize_stage, owner, name)
    spec = MuonDimensionNumbers(-2, -1) if weight_dimension_numbers is None \
        else weight_dimension_numbers

    def update_fn(updates: Updates, state: AdaMuonState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, AdaMuonState]:
        check_state_type(state, AdaMuonState, owner)
        s, state = momentum.update(in_compute_dtype(updates, params, owner), state, params,
                                   **extra_args)
        o = orthogonalize_tree(s, dims_of_leaves(spec, s, owner, name),
                                jnp.asarray(coeffs, float), ns_steps, "frobenius", NS_EPS,
                                False, owner, mesh, ns_method, safety, ns_dtype)
        u, state = normalize.update(o, state, params, **extra_args)
        return jax.tree.map(lambda u, g: u if ft.is_placeholder(g) else u.astype(g.dtype),
                            u, updates, is_leaf=ft.is_placeholder), state

    return GradientTransformation(momentum.init, update_fn)


@declare_optimizer("beyond optax", "Si et al., 2025", optax=None, stressed=True, summary=(
    "AdaMuon (Si et al., 2025): Muon on the momentum's sign with an element-wise second "
    "moment on the orthogonalized update, rescaled to Adam's RMS; AdamW on the other leaves."),
    signature="adamuon(learning_rate, ns_coeffs='standard', ns_steps=5, beta=0.95, ...)")
@hyperparameters(static=("mesh", "ns_dtype"), learning_rate="schedule", ns_steps="int",
                 beta="number", beta2="number or None", eps="number", weight_decay="schedule",
                 adam_b1="number", adam_b2="decay", adam_eps="number", adam_eps_root="number",
                 adam_weight_decay="schedule", adam_learning_rate="schedule or None")
@shared_args()
def adamuon(learning_rate: ScalarOrSchedule, ns_coeffs: Any = "standard", ns_steps: int = 5,
            beta: float = 0.95, eps: float = 1e-8, weight_decay: ScalarOrSchedule = 0.01,
            weight_decay_mask: Optional[MaskOrFn] = None, mu_dtype: Optional[Any] = None, *,
            beta2: Optional[float] = None, nesterov: bool = True, adam_b1: float = 0.9,
            adam_b2: float = 0.95, adam_eps: float = 1e-8, adam_eps_root: float = 0.0,
            adam_weight_decay: ScalarOrSchedule = 0.0,
            adam_learning_rate: Optional[ScalarOrSchedule] = None,
            muon_weight_dimension_numbers: Any = None,
            mesh: Optional[jax.sharding.Mesh] = None, ns_method: str = "standard",
            ns_dtype: Optional[Any] = None, cautious_weight_decay: bool = False
            ) -> GradientTransformation:
    """AdaMuon (Si et al., 2025): adaptive, RMS-aligned Muon; AdamW for the other leaves.

    Update rule for an AdaMuon leaf: ``U`` = :func:`scale_by_adamuon`'s update (RMS 0.2
    per matrix); ``p -= lr * (U + weight_decay * p)``. Other leaves:
    ``adamw(adam_learning_rate, adam_b1, adam_b2, adam_eps, adam_eps_root,
    weight_decay=adam_weight_decay)`` without Nesterov (the authors' GPT-2 runs pair it
    with ``torch.optim.AdamW(betas=(0.9, 0.95))`` at the same learning rate). The RMS
    alignment lets ``learning_rate`` be an AdamW learning rate.

    Which leaves are AdaMuon's: as :func:`functrain.contrib.muon`, the 2-D ones with
    ``muon_weight_dimension_numbers=None``, else those whose entry is not ``None``.
    The paper (v2 onwards) and the official code agree on the rule; the code's defaults
    are used (weight decay 0.01; the second moment decays at the momentum's ``beta``).

    Reference: Si, Zhang & Shen, 2025, "AdaMuon: Adaptive Muon Optimizer"
    (arXiv:2507.11005); github.com/Chongjie-Si/AdaMuon.

    Args:
      learning_rate: AdaMuon's step size, a number or a schedule of the step count.
      ns_coeffs: Newton-Schulz coefficients, as :func:`functrain.contrib.muon` takes them.
      <shared: ns_steps>
      beta: the momentum's decay rate, in ``[0, 1)``.
      eps: AdaMuon's epsilon (added to ``sqrt(nu)`` and to the rescaling's norm).
      weight_decay: decoupled weight decay of the AdaMuon leaves (multiplied by
        ``learning_rate``), ``>= 0``; the authors' default 0.01.
      weight_decay_mask: where to apply ``weight_decay`` among the AdaMuon leaves: a tree
        (or prefix) of bools or a function of the params; ``None``: all.
      mu_dtype: storage dtype of both optimizers' first moments.
      beta2: the second moment's decay rate; ``None``: ``beta`` (the official code).
      nesterov: Nesterov momentum for the AdaMuon leaves (default ``True``).
      <shared: adam_b1, adam_b2>
      adam_eps: AdamW's ``eps``.
      <shared: adam_eps_root, adam_weight_decay, adam_learning_rate>
      muon_weight_dimension_numbers: which leaves are AdaMuon's and their matrix axes, as
        :func:`functrain.contrib.muon` takes them.
      mesh: divide Newton-Schulz over this mesh's devices, as ``muon(mesh=)``.
      ns_method: ``'standard'`` or ``'gram'``, as ``muon(ns_method=)``.
      ns_dtype: the dtype Newton-Schulz runs in, as ``muon(ns_dtype=)``.
      cautious_weight_decay: apply the weight decay only where the update and the param
        agree in sign (Cautious Weight Decay, Chen et al., 2025; see
        :func:`functrain.add_decayed_weights`), to ``weight_decay`` and
        ``adam_weight_decay`` alike; default ``False``.

    Returns:
      A ``GradientTransformation`` whose state is ``PartitionState`` with the entries
      ``'muon'`` (``MaskedState((AdaMuonState, EmptyState, EmptyState))``) and ``'adam'``
      (AdamW's masked state), laid out as :func:`functrain.contrib.muon`'s.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.adamuon(1e-3)
    >>> params = {'w': jnp.ones((4, 3)), 'b': jnp.zeros(3)}
    >>> state = opt.init(params)
    >>> u, state = opt.update({'w': jnp.eye(4, 3), 'b': jnp.ones(3)}, state, params)
    >>> [round(float(x), 5) for x in (u['w'][0, 0], u['b'][0])]  # AdaMuon's, AdamW's
    [-0.00041, -0.001]
    """
    owner = "adamuon"
    check_betas(owner, beta=beta, adam_b1=adam_b1, adam_b2=adam_b2)
    if beta2 is not None:
        check_betas(owner, beta2=beta2)
    check_nonnegative(owner, eps=eps, adam_eps=adam_eps, adam_eps_root=adam_eps_root)
    check_range("weight_decay", weight_decay, 0.0, owner=owner)
    check_options(owner, ns_steps, "frobenius", ns_method, ns_dtype)
    resolve_coeffs(ns_coeffs, ns_steps, owner)  # checked here, resolved by scale_by_adamuon
    spec = (MuonDimensionNumbers() if muon_weight_dimension_numbers is None
            else muon_weight_dimension_numbers)
    direction = [scale_by_adamuon(beta, beta2, eps, ns_coeffs, ns_steps, mu_dtype,
                                  nesterov=nesterov, weight_dimension_numbers=spec, mesh=mesh,
                                  ns_method=ns_method, ns_dtype=ns_dtype)]
    adam_tx = adamw(learning_rate if adam_learning_rate is None else adam_learning_rate,
                    b1=adam_b1, b2=adam_b2, eps=adam_eps, eps_root=adam_eps_root,
                    mu_dtype=mu_dtype, weight_decay=adam_weight_decay,
                    cautious_weight_decay=cautious_weight_decay)
    return muon_family(direction, learning_rate, weight_decay, weight_decay_mask, adam_tx,
                       muon_weight_dimension_numbers, cautious=cautious_weight_decay)
