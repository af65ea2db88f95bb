"""NorMuon: Muon's orthogonalized momentum, normalized per neuron (Li et al., 2025).

Muon's update has equal singular values, but its rows (one per output neuron) can still
have very different norms. NorMuon keeps a moving average of each neuron's mean squared
update (one number per neuron: the memory of a bias vector, not of Adam's second moment),
divides each row by its root, and rescales the matrix back to the norm it had. optax does
not have it. It is built from Muon's pieces in :mod:`functrain.families.muon.muon`: the same
dimension numbers (stacked layers, conv kernels), the same batched Newton-Schulz over the
tree (``ns_coeffs``, ``ns_steps``, ``ns_method`` and ``mesh`` as ``muon`` takes them) and the
same split that sends the other leaves to AdamW.
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
                                          per_dims, resolve_coeffs, scale_by_shape, muon_family)
from functrain.matrix.dimension_numbers import (MuonDimensionNumbers, dims_of_leaves, is_dims,
                                                leaf_axes)
from functrain.numerics import abs_sq, ema_update
from functrain.families.adam.optimizers import adamw
from functrain.engine.protocol import (GradientTransformation, MaskOrFn, Params, ScalarOrSchedule,
                                       Updates)
from functrain.engine.stage import LeafChecks, LeafStage
from functrain.docstrings import shared_args

Array = jax.Array

__all__ = ["NorMuonState", "scale_by_normuon", "normuon"]

# The official code's Newton-Schulz input scaling, X / (||X||_F + 1e-7) (Keller Jordan's
# zeropower_via_newtonschulz5, which NorMuon and AdaMuon copy).
NS_EPS = 1e-7


@state_value_kinds(mu="signed", nu="unsigned")
class NorMuonState(NamedTuple):
    """State of :func:`scale_by_normuon`: the momentum and the per-neuron second moment.

    Attributes:
      mu: the momentum, a tree like the params.
      nu: each neuron's moving average of its mean squared orthogonalized update: per
        leaf, the leaf's shape with its reduction axes of size 1 (a ``(fan_in, fan_out)``
        weight has a ``(1, fan_out)`` entry).

    >>> import jax.numpy as jnp
    >>> scale_by_normuon().init({'w': jnp.zeros((2, 3))}).nu
    {'w': Array([[0., 0., 0.]], dtype=float32)}
    """

    mu: Any
    nu: Any


def _nu_shape(shape: tuple, dims: MuonDimensionNumbers, owner: str) -> tuple:
    red, _ = leaf_axes(dims, shape, f"of shape {shape}", owner)
    return tuple(1 if axis in red else n for axis, n in enumerate(shape))


@hyperparameters(static=("mesh", "ns_dtype"), beta="number", beta2="number", eps="number",
                 ns_steps="int")
@shared_args()
def scale_by_normuon(beta: float = 0.95, beta2: float = 0.95, eps: float = 1e-10,
                     ns_coeffs: Any = "standard", ns_steps: int = 5,
                     mu_dtype: Optional[Any] = None, *, nesterov: bool = True,
                     weight_dimension_numbers: Any = None,
                     mesh: Optional[jax.sharding.Mesh] = None, ns_method: str = "standard",
                     ns_dtype: Optional[Any] = None
                     ) -> GradientTransformation:
    """Rescale updates by NorMuon's rule (Li et al., 2025), before its width scaling.

    Update rule, per leaf (the official code's, which differs from the paper's Algorithm 1
    as noted): ``mu = beta mu + (1 - beta) g``; ``m = beta mu + (1 - beta) g`` (Nesterov,
    the code's default; the paper's algorithm uses ``m = mu``; no bias correction, as
    neither has one); each matrix ``M`` of ``m`` (see :class:`MuonDimensionNumbers`)
    becomes ``O = NS(M / (||M||_F + 1e-7))``, Muon's Newton-Schulz iteration; then per
    neuron (each entry of the output and stacked axes) ``nu = beta2 nu + (1 - beta2)
    mean(|O|**2)`` over the reduction axes, ``O' = O / (sqrt(nu) + eps)``, and each matrix
    is rescaled to its norm before the division, ``O' ||O||_F / (||O'||_F + eps)`` (the
    code; the paper instead scales the step to ``0.2 sqrt(m n) / ||O'||_F``, Adam's RMS).
    A neuron is an entry of the output axes, its mean taken over all the reduction axes (for
    a 4-D conv filter the official code averages over the last kernel axis only).

    Reference: Li, Liu, Liang, Chen & Zhao, 2025, "NorMuon: Making Muon more
    efficient and scalable" (arXiv:2510.05491); official code github.com/zichongli5/NorMuon
    (its defaults: ``beta = beta2 = 0.95``, ``eps = 1e-10``).

    Args:
      beta: the momentum's decay rate, in ``[0, 1)``.
      beta2: the per-neuron second moment's decay rate, in ``[0, 1)``.
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
      A ``GradientTransformation`` whose state is :class:`NorMuonState`.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_normuon()
    >>> g = {'w': jnp.array([[3., 0.], [0., 4.]])}
    >>> u, state = tx.update(g, tx.init(g))
    >>> [round(float(x), 3) for x in jnp.diag(u['w'])]  # both rows now of one norm
    [0.942, 0.942]
    """
    owner = "scale_by_normuon"
    name = "weight_dimension_numbers"
    check_betas(owner, beta=beta, beta2=beta2)
    check_nonnegative(owner, eps=eps)
    check_options(owner, ns_steps, "frobenius", ns_method, ns_dtype)
    coeffs, safety = resolve_coeffs(ns_coeffs, ns_steps, owner)

    def stage(dims: MuonDimensionNumbers, leaf: Any) -> LeafStage:
        return LeafStage(
            name=owner, update_leaf=leaf, state_cls=NorMuonState, leaf_fields=("mu", "nu"), init_leaf=lambda p: (
                ft.zeros_like(p, mu_dtype), jnp.zeros(_nu_shape(p.shape, dims, owner), p.dtype)),
                checks=LeafChecks(shaped_fields=("mu",)))

    def momentum_stage(dims: MuonDimensionNumbers) -> LeafStage:
        def leaf(g: Array, s: Any, p: Any, ctx: Any) -> tuple:
            mu = ema_update(g, s.mu, beta)
            return (ema_update(g, mu, beta) if nesterov else mu), s._replace(mu=mu)
        return stage(dims, leaf)

    def normalize_stage(dims: MuonDimensionNumbers) -> LeafStage:
        def leaf(o: Array, s: Any, p: Any, ctx: Any) -> tuple:
            red, out = leaf_axes(dims, o.shape, f"of shape {o.shape}", owner)
            sq = abs_sq(o)
            norm = jnp.sqrt(jnp.sum(sq, axis=red + out, keepdims=True))
            # The mean over the reduction axes (a sum over at least one entry: no 0/0 on
            # zero-size leaves).
            fan_in = max(1, math.prod(o.shape[a] for a in red))
            nu = ema_update(jnp.sum(sq, axis=red, keepdims=True) / fan_in, s.nu, beta2)
            o = o / (jnp.sqrt(nu) + eps)
            o = o * (norm / (jnp.sqrt(jnp.sum(abs_sq(o), axis=red + out, keepdims=True)) + eps))
            return o, s._replace(nu=nu)
        return stage(dims, leaf)

    momentum = per_dims(weight_dimension_numbers, momentum_stage, owner, name)
    normalize = per_dims(weight_dimension_numbers, normalize_stage, owner, name)
    spec = MuonDimensionNumbers(-2, -1) if weight_dimension_numbers is None \
        else weight_dimension_numbers

    def init_fn(params: Params) -> NorMuonState:
        # Every leaf checked against its dimension numbers first, the error naming its path.
        dims = iter(dims_of_leaves(spec, params, owner, name))
        state = momentum.init(params)
        if weight_dimension_numbers is None or is_dims(weight_dimension_numbers):
            return state
        # Per-leaf dimension numbers: the engine built every ``nu`` for the default axes;
        # give each leaf the shape its own reduction axes make.
        slots, treedef = jax.tree_util.tree_flatten(state.nu, is_leaf=ft.is_placeholder)
        return state._replace(nu=treedef.unflatten([
            n if ft.is_placeholder(n) else jnp.zeros(_nu_shape(p.shape, next(dims), owner),
                                                     n.dtype)
            for n, p in zip(slots, jax.tree_util.tree_leaves(params,
                                                             is_leaf=ft.is_placeholder))]))

    def update_fn(updates: Updates, state: NorMuonState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, NorMuonState]:
        check_state_type(state, NorMuonState, owner)
        m, state = momentum.update(in_compute_dtype(updates, params, owner), state, params,
                                   **extra_args)
        o = orthogonalize_tree(m, dims_of_leaves(spec, m, owner, name),
                                jnp.asarray(coeffs, float), ns_steps, "frobenius", NS_EPS,
                                False, owner, mesh, ns_method, safety, ns_dtype)
        u, state = normalize.update(o, state, params, **extra_args)
        return jax.tree.map(lambda u, g: u if ft.is_placeholder(g) else u.astype(g.dtype),
                            u, updates, is_leaf=ft.is_placeholder), state

    return GradientTransformation(init_fn, update_fn)


@declare_optimizer("beyond optax", "Li et al., 2025", optax=None, stressed=True, summary=(
    "NorMuon (Li et al., 2025): Muon's orthogonalized momentum with a per-neuron second "
    "moment normalizing its rows, at the matrix's norm; AdamW on the other leaves."),
    signature="normuon(learning_rate, ns_coeffs='standard', ns_steps=5, beta=0.95, ...)")
@hyperparameters(static=("mesh", "ns_dtype"), learning_rate="schedule", ns_steps="int",
                 beta="number", beta2="number", eps="number", weight_decay="schedule",
                 adam_b1="number", adam_b2="decay", adam_eps="number", adam_eps_root="number",
                 adam_weight_decay="schedule", adam_learning_rate="schedule or None")
@shared_args()
def normuon(learning_rate: ScalarOrSchedule, ns_coeffs: Any = "standard", ns_steps: int = 5,
            beta: float = 0.95, eps: float = 1e-10, weight_decay: ScalarOrSchedule = 0.0,
            weight_decay_mask: Optional[MaskOrFn] = None, mu_dtype: Optional[Any] = None, *,
            beta2: float = 0.95, nesterov: bool = True, adam_b1: float = 0.9,
            adam_b2: float = 0.95, adam_eps: float = 1e-10, adam_eps_root: float = 0.0,
            adam_weight_decay: ScalarOrSchedule = 0.0,
            adam_learning_rate: Optional[ScalarOrSchedule] = None,
            muon_weight_dimension_numbers: Any = None,
            mesh: Optional[jax.sharding.Mesh] = None, ns_method: str = "standard",
            ns_dtype: Optional[Any] = None, cautious_weight_decay: bool = False
            ) -> GradientTransformation:
    """NorMuon (Li et al., 2025): Muon normalized per neuron, AdamW for the other leaves.

    Update rule for a NorMuon leaf: ``O'`` = :func:`scale_by_normuon`'s normalized
    orthogonalized momentum; ``p -= lr * (sqrt(max(1, fan_out / fan_in)) O' +
    weight_decay * p)`` (Muon's width scaling, as the official code; ``fan_in`` /
    ``fan_out``: the sizes of the reduction / output axes). Other leaves:
    ``adamw(adam_learning_rate, adam_b1, adam_b2, adam_eps, adam_eps_root,
    weight_decay=adam_weight_decay)``, without Nesterov (the official code's auxiliary
    Adam, whose defaults ``adam_b2 = 0.95``, ``adam_eps = 1e-10`` these are; it also uses
    its own learning rate, 3e-4 by default: pass ``adam_learning_rate``).

    Which leaves are NorMuon's: as :func:`functrain.contrib.muon`, the 2-D ones with
    ``muon_weight_dimension_numbers=None``, else those whose entry is not ``None``.
    Where the paper's Algorithm 1 and the official code differ (Nesterov momentum; the
    rescaling to the pre-normalization norm times Muon's width factor instead of
    ``0.2 sqrt(m n) / ||O'||_F``), this follows the code; see :func:`scale_by_normuon`.

    Reference: Li, Liu, Liang, Chen & Zhao, 2025, "NorMuon: Making Muon more
    efficient and scalable" (arXiv:2510.05491); github.com/zichongli5/NorMuon.

    Args:
      learning_rate: NorMuon's step size (the authors': 0.02), a number or a schedule.
      ns_coeffs: Newton-Schulz coefficients, as :func:`functrain.contrib.muon` takes them.
      <shared: ns_steps>
      beta: the momentum's decay rate, in ``[0, 1)``.
      eps: NorMuon's epsilon (added to ``sqrt(nu)`` and to the rescaling's norm).
      weight_decay: decoupled weight decay of the NorMuon leaves (multiplied by
        ``learning_rate``), ``>= 0``.
      weight_decay_mask: where to apply ``weight_decay`` among the NorMuon leaves: a tree
        (or prefix) of bools or a function of the params; ``None``: all.
      mu_dtype: storage dtype of both optimizers' first moments.
      beta2: the per-neuron second moment's decay rate, in ``[0, 1)``.
      nesterov: Nesterov momentum for the NorMuon leaves (default ``True``).
      <shared: adam_b1, adam_b2>
      adam_eps: AdamW's ``eps``.
      <shared: adam_eps_root, adam_weight_decay, adam_learning_rate>
      muon_weight_dimension_numbers: which leaves are NorMuon's and their matrix axes, as
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
      ``'muon'`` (``MaskedState((NorMuonState, EmptyState, EmptyState, EmptyState))``) and
      ``'adam'`` (AdamW's masked state), laid out as :func:`functrain.contrib.muon`'s.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.normuon(0.02)
    >>> params = {'w': jnp.ones((4, 3)), 'b': jnp.zeros(3)}
    >>> state = opt.init(params)
    >>> u, state = opt.update({'w': jnp.eye(4, 3), 'b': jnp.ones(3)}, state, params)
    >>> [round(float(x), 4) for x in (u['w'][0, 0], u['b'][0])]  # NorMuon's, AdamW's
    [-0.0137, -0.02]
    """
    owner = "normuon"
    check_betas(owner, beta=beta, beta2=beta2, adam_b1=adam_b1, adam_b2=adam_b2)
    check_nonnegative(owner, eps=eps, adam_eps=adam_eps, adam_eps_root=adam_eps_root)
    check_range("weight_decay", weight_decay, 0.0, owner=owner)
    check_options(owner, ns_steps, "frobenius", ns_method, ns_dtype)
    resolve_coeffs(ns_coeffs, ns_steps, owner)  # checked here, resolved by scale_by_normuon
    spec = (MuonDimensionNumbers() if muon_weight_dimension_numbers is None
            else muon_weight_dimension_numbers)
    direction = [scale_by_normuon(beta, beta2, eps, ns_coeffs, ns_steps, mu_dtype,
                                  nesterov=nesterov, weight_dimension_numbers=spec, mesh=mesh,
                                  ns_method=ns_method, ns_dtype=ns_dtype),
                 scale_by_shape(spec, None)]
    adam_tx = adamw(learning_rate if adam_learning_rate is None else adam_learning_rate,
                    b1=adam_b1, b2=adam_b2, eps=adam_eps, eps_root=adam_eps_root,
                    mu_dtype=mu_dtype, weight_decay=adam_weight_decay,
                    cautious_weight_decay=cautious_weight_decay)
    return muon_family(direction, learning_rate, weight_decay, weight_decay_mask, adam_tx,
                       muon_weight_dimension_numbers, cautious=cautious_weight_decay)
