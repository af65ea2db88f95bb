"""PSGD Kron (Li, 2018): a Kronecker-factored preconditioner learned by whitening.

Each leaf ``G`` of shape ``(d_1, ..., d_k)`` keeps one factor ``Q_i`` per axis:
an upper-triangular ``d_i x d_i`` matrix, or a vector (a diagonal matrix) for
axes of size 1, above ``max_size_triangular``, too skewed (``d_i**2 >
max_skew_triangular * G.size``), of leaves with fewer than
``min_ndim_triangular`` axes, or chosen by ``memory_save_mode``. A scalar
leaf keeps one scalar factor. With ``Q = Q_1 (x) ... (x) Q_k``, the
preconditioner is ``P = Q^H Q`` and the update is ``P m`` (``m`` the
bias-corrected momentum), applied axis by axis: ``Q_i^H Q_i`` along axis ``i``.

The factors are learned by PSGD's whitening criterion: with ``V`` a standard
normal draw shaped like ``G`` and ``h`` the (damped) momentum, ``A = Q h`` and
``B = Q^{-H} V`` (triangular solves), each factor takes a step on the Lie group
of triangular matrices, ``Q_i <- Q_i - lr_Q / ||S_i|| triu(A_i A_i^H - B_i
B_i^H) Q_i`` with ``S_i = A_i A_i^H + B_i B_i^H`` (``X_i``: ``X`` unfolded with
axis ``i`` as rows, ``||.||`` a cheap lower bound of the spectral norm; a
diagonal factor uses the diagonals and their largest entry). Its fixed point
whitens the preconditioned momentum: ``E[(P h)(P h)^H] = E[V V^H] = I``
per factor.

A whole-tree transformation, not a ``LeafStage``: whether the preconditioner is
updated is ONE coin flip for the tree (one ``lax.cond``, so a skipped step costs
nothing), and leaves of one shape and factor structure are stacked into groups,
so each group's factor updates, triangular solves (one matrix per LAPACK call on
CPU, :func:`functrain.linalg.map_matrices`) and ``P m`` are batched operations
(:mod:`functrain.matrix.kron_factors`); the state stays per leaf. With
``block_size``, each block of a split leaf is a leaf of its own here; with
``weight_dimension_numbers``, each layer of a stacked leaf.

References: Xi-Lin Li, 2018, "Preconditioned Stochastic Gradient Descent" (IEEE
TNNLS); Li, 2019, "Preconditioner on Matrix Lie Group for SGD"; the ``kron``
variant of Li's psgd_torch and of Evan Walters' psgd_jax / kron_torch.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from functrain import tree as ft
from functrain.families.preconditioned import kron_steps as ks
from functrain.matrix.blocks import check_block_size
from functrain.matrix.dimension_numbers import check_dimension_numbers, stacked_view
from functrain.matrix.shape_groups import group_key, shape_groups, stack_units, unstack_units
from functrain.numerics import bias_correction_factor
from functrain.arg_checks import (check_betas, check_bools, check_nonnegative, check_range,
                                  check_state_type)
from functrain.declarations import declare_optimizer, hyperparameters, state_value_kinds
from functrain.engine.protocol import (GradientTransformation, MaskOrFn, Params, ScalarOrSchedule,
                                       Updates)
from functrain.engine.counts import safe_increment, value_at
from functrain.engine.program import chain
from functrain.transforms.scaling import add_decayed_weights, scale_by_learning_rate
from functrain.docstrings import shared_args

Array = jax.Array

__all__ = ["KronState", "precond_update_prob_schedule", "scale_by_kron", "kron"]

_MEMORY_SAVE_MODES = (None, "one_diag", "smart_one_diag", "all_diag")


@state_value_kinds(mu="signed", qs="matrix")
class KronState(NamedTuple):
    """State of :func:`scale_by_kron`.

    Attributes:
      count: the number of steps taken (int32).
      key: the PRNG key (a raw ``uint32`` key) of the coin flips and of the
        whitening noise; split every step.
      mu: the momentum, a tree like the params (``mu_dtype`` or the params').
      qs: per leaf of the params, a tuple of its Kronecker factors: an
        upper-triangular ``(d, d)`` matrix or a ``(d,)`` vector (diagonal) per
        axis (after ``merge_dims``), one ``()`` scalar for a scalar leaf. A leaf
        split by ``block_size``: ``(blocks, b, b)`` / ``(blocks, b)`` per axis, row-major
        block order (a shorter last block in the leading corner; the rest unused).

    >>> import jax.numpy as jnp, functrain
    >>> state = functrain.contrib.scale_by_kron().init({'w': jnp.zeros((3, 2))})
    >>> [q.shape for q in state.qs['w']]
    [(3, 3), (2, 2)]
    """

    count: Array
    key: Array
    mu: Any
    qs: Any


def precond_update_prob_schedule(max_prob: float = 1.0, min_prob: float = 0.03,
                                 decay: float = 0.001, flat_start: int = 500
                                 ) -> Callable[[Array], Array]:
    """The reference's schedule of the preconditioner update probability.

    ``p(n) = clip(max_prob * exp(-decay * (n - flat_start)), min_prob,
    max_prob)``: ``max_prob`` for the first ``flat_start`` steps, then an
    exponential anneal to ``min_prob`` (0.03 by about step 4000 with the
    defaults). The preconditioner is learned early; later updates only track
    it, so about 1 step in 33 pays for one.

    Args:
      max_prob: the probability at the start, in ``(0, 1]``.
      min_prob: the floor, in ``(0, max_prob]``.
      decay: the exponential rate per step, ``>= 0``.
      flat_start: the number of steps held at ``max_prob``.

    Returns:
      A schedule: the step count (from 0) -> the probability, in the default float for an
      integer count (float64 under ``jax_enable_x64``, as optax's schedules), weakly typed,
      and in a float count's dtype.

    >>> import jax.numpy as jnp
    >>> f = precond_update_prob_schedule()
    >>> [round(float(f(jnp.asarray(n))), 3) for n in (0, 500, 1500, 10000)]
    [1.0, 1.0, 0.368, 0.03]
    """
    check_range("max_prob", max_prob, 1e-30, 1.0, high_inclusive=True,
                owner="precond_update_prob_schedule")
    check_range("min_prob", min_prob, 1e-30, max_prob, high_inclusive=True,
                owner="precond_update_prob_schedule")
    check_nonnegative("precond_update_prob_schedule", decay=decay)

    def schedule(count: Array) -> Array:
        # As palm_beta2_schedule: an integer count becomes the default float, weakly typed
        # (float64 under jax_enable_x64, as optax's schedules); a float count keeps its dtype.
        p = max_prob * jnp.exp(-decay * (jnp.asarray(count) * 1.0 - flat_start))
        return jnp.clip(p, min_prob, max_prob)

    return schedule


# --------------------------------------------------------------------------
# Test hook: False gives every leaf its own group (the per-leaf program).
_GROUP_SAME_SHAPES = True
# The most rows (index entries) of the gather that puts the noise in group order.
_MAX_GATHER_ROWS = 1 << 16


# --------------------------------------------------------------------------
# The transformation
# --------------------------------------------------------------------------

def _check_options(owner: str, max_size_triangular: Any, min_ndim_triangular: Any,
                   max_skew_triangular: Any, memory_save_mode: Any) -> None:
    for name, value in (("max_size_triangular", max_size_triangular),
                        ("min_ndim_triangular", min_ndim_triangular)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise TypeError(f"{owner}: {name} must be a Python int (it decides the state's "
                            f"shapes), got {type(value).__name__} {value!r:.40}.")
    check_range("max_size_triangular", max_size_triangular, 0.0, owner=owner)
    check_range("min_ndim_triangular", min_ndim_triangular, 0.0, owner=owner)
    if max_skew_triangular is not None:
        check_range("max_skew_triangular", max_skew_triangular, 0.0, owner=owner)
    if memory_save_mode not in _MEMORY_SAVE_MODES:
        raise ValueError(f"{owner}: memory_save_mode must be one of {list(_MEMORY_SAVE_MODES)}, "
                         f"got {memory_save_mode!r}.")


def _read_state(cfg: ks.KronConfig, updates: Updates, state: KronState,
                params: Optional[Params]) -> tuple:
    """The updates' and the state's leaves, checked against each other and the params:
    ``(gs, mus, qs, views, treedef)``."""
    owner = cfg.owner
    check_state_type(state, KronState, owner)
    paths, gs, treedef = ft.flatten_with_paths(updates)
    gs = [jnp.asarray(g) for g in gs]
    if params is not None:
        ft.check_structure(updates, params, "params", "updates")
        ft.check_shapes(paths, treedef.flatten_up_to(params), gs, "updates", "params")
    ft.check_leaf_dtypes(paths, gs, [True] * len(gs), owner, "updates")
    mus = ft.flatten_like(treedef, state.mu, f"{owner} state .mu", updates, "updates")
    ft.check_shapes(paths, mus, gs, "updates", f"{owner} state .mu")
    try:
        qs = treedef.flatten_up_to(state.qs)
    except (ValueError, TypeError):
        raise ValueError(f"{owner}: the state's .qs does not have the structure of the "
                         f"updates ({treedef}): was it made by this transformation's "
                         f"init?") from None
    views = ks.views_of(cfg, updates, gs)
    ks.check_factors(owner, paths, gs, qs,
                     [ks.plan(cfg, jnp.shape(x), v) for x, v in zip(gs, views)])
    return gs, mus, qs, views, treedef


@hyperparameters(static=("max_size_triangular", "max_skew_triangular", "min_ndim_triangular",
                 "seed", "mesh", "block_size", "weight_dimension_numbers", "group_same_shapes"),
                 b1="number", preconditioner_update_probability="schedule or None",
                 max_size_triangular="number", max_skew_triangular="bound or None",
                 min_ndim_triangular="number", precond_lr="number", precond_init_scale="number",
                 update_clip_rms="number or None", seed="number", block_size="number or None")
def scale_by_kron(b1: float = 0.9, normalize_grads: bool = False,
                  preconditioner_update_probability: Optional[ScalarOrSchedule] = None,
                  max_size_triangular: int = 8192, max_skew_triangular: Optional[float] = None,
                  min_ndim_triangular: int = 2, memory_save_mode: Optional[str] = None,
                  momentum_into_precond_update: bool = True, precond_lr: float = 0.1,
                  precond_init_scale: float = 1.0, update_clip_rms: Optional[float] = 1.1,
                  mu_dtype: Optional[Any] = None, precond_dtype: Optional[Any] = None,
                  seed: int = 0, mesh: Optional[jax.sharding.Mesh] = None, *,
                  block_size: Optional[int] = None, merge_dims: bool = False,
                  weight_dimension_numbers: Any = None,
                  group_same_shapes: bool = False) -> GradientTransformation:
    """PSGD Kron's preconditioned momentum (Li, 2018; the ``kron`` variant).

    Update rule, per leaf with gradient ``g`` at step ``t`` (from 1)::

        g <- g / (||g|| + 1e-16)                         (if normalize_grads)
        mu <- b1 mu + (1 - b1) g;    m = mu / (1 - b1**t)
        with probability p(t - 1):   Q_i <- Q_i - precond_lr / ||S_i|| triu(A_i A_i^H - B_i B_i^H) Q_i
        u = P m = Q^H Q m  (Q_i^H Q_i along axis i)
        u <- u / max(1, rms(u) / update_clip_rms)

    where ``h = m`` (or ``g`` without ``momentum_into_precond_update``) plus
    ``sqrt(eps_f32) mean|h| V``, ``V`` standard normal, ``A = Q h``, ``B =
    Q^{-H} V``, ``S_i = A_i A_i^H + B_i B_i^H`` (see the module docstring);
    diagonal factors use the diagonals and their largest entry. Before each
    preconditioner update the factors of a leaf are rescaled to equal largest
    entries (their product, so every number above, is unchanged: it only
    keeps them in range; the reference does it every ~100 updates). Factors
    start as ``precond_init_scale**(1/k) I``. The coin flip uses ``state.key``
    and ``lax.cond``: probabilities and schedules never recompile.

    Defaults are the reference's (Li's psgd_torch ``kron``, Walters' psgd_jax):
    ``b1=0.9``; ``precond_lr=0.1`` (the Lie-group step is normalized by
    ``||S_i||``: scale-free); update probability 1.0 for 500 steps then
    annealed to 0.03 (:func:`precond_update_prob_schedule`, at the steps taken
    so far): the preconditioner is learned early; triangular factors up to 8192
    per axis on leaves with 2+ axes (vectors: diagonal); the update's RMS is
    about 1 once the preconditioner whitens, so it is clipped at 1.1.

    References: Xi-Lin Li, 2018, "Preconditioned Stochastic Gradient Descent";
    Li, 2019, "Preconditioner on Matrix Lie Group for SGD".

    Args:
      b1: the momentum's decay, in ``[0, 1)`` (``0``: no momentum; ``mu`` is
        still kept).
      normalize_grads: divide each gradient leaf by its norm first.
      preconditioner_update_probability: a probability in ``[0, 1]`` or a
        schedule of the step count; ``None``: the reference's schedule.
      max_size_triangular: axes larger than this get diagonal factors.
      max_skew_triangular: axes with ``d**2 > max_skew_triangular * size`` get
        diagonal factors; ``None``: no limit.
      min_ndim_triangular: leaves with fewer axes get diagonal factors only.
      memory_save_mode: ``None`` (triangular where allowed), ``'one_diag'``
        (the largest axis diagonal), ``'smart_one_diag'`` (it, only if strictly
        the largest) or ``'all_diag'``.
      momentum_into_precond_update: learn the preconditioner from the momentum
        (default) rather than the raw gradient.
      precond_lr: the factors' step size, ``>= 0``.
      precond_init_scale: the initial preconditioner's scale, ``> 0``.
      update_clip_rms: clip each leaf's update to this RMS; ``None``: no clip.
      mu_dtype: the momentum's storage dtype; ``None``: the params'.
      precond_dtype: the factors' storage dtype; ``None``: the params'
        compute dtype (float32 for 16-bit params).
      seed: the seed of ``state.key``.
      mesh: a ``jax.sharding.Mesh`` (beyond psgd-jax): each group's factor update
        (triangular solves included) and ``P m`` are divided over its devices, each
        taking ``1/N`` of the group's leaves; ``None``: every device does all of them.
      block_size: split each axis (after merging) longer than this into ``ceil(d /
        block_size)`` blocks, as Shampoo does (the last may be shorter, never padded:
        :func:`functrain.matrix.blocks.block_grid`); each block has its own
        factors, as a separate leaf would (their kinds those of a full-size block), and
        draws its noise in row-major block order, as separate leaves would; the clip
        and ``normalize_grads`` stay per leaf. ``None`` (the reference's): no blocks.
      merge_dims: merge neighbouring axes while the product stays ``<=
        max_size_triangular`` (SOAP's rule: :func:`functrain.matrix.blocks.merged_shape`),
        then precondition the reshaped leaf (a ``(64, 64)`` matrix becomes one axis).
      weight_dimension_numbers: stacked layers (a scanned model's ``(layers, m, n)``
        weights): ``MuonDimensionNumbers(reduction_axis, output_axis)``
        (:class:`functrain.contrib.MuonDimensionNumbers`), one for every leaf, a tree of
        them (``None`` entries) or a function of the params. A leaf given them is a stack
        of separate leaves ``(rows, cols)`` (the reduction and the output axes multiplied
        together), one per entry of its other (layer) axes: each its own factors, noise
        (drawn in layer order, as those layers passed as leaves in a row would), clip and
        ``normalize_grads``; the same numbers as those separate leaves, with ``qs``
        stacked over the layer axes (``(layers, m, m)``), all layers batched with the
        tree's same-shape leaves (``functrain.matrix.dimension_numbers``). ``None``:
        every leaf as it is.
      group_same_shapes: run same-shape leaves as one stacked leaf, the state kept per
        leaf, the noise drawn in leaf order: the same numbers, fewer computations, but on
        XLA:CPU no shorter compile (``functrain.matrix.shape_groups``). ``False`` (default).

    Returns:
      A ``GradientTransformation`` whose state is :class:`KronState`. Complex
      leaves are supported (Hermitian transposes throughout).

    >>> import jax, jax.numpy as jnp, functrain
    >>> tx = functrain.contrib.scale_by_kron()
    >>> g = {'w': jnp.array([[3., 0.], [0., 4.]]), 'b': jnp.ones(3)}
    >>> u, state = jax.jit(tx.update)(g, tx.init(g))
    >>> [q.shape for q in state.qs['w']], [q.shape for q in state.qs['b']]
    ([(2, 2), (2, 2)], [(3,)])
    >>> bool(jnp.sqrt(jnp.mean(u['w'] ** 2)) <= 1.1)  # clipped to RMS 1.1
    True
    """
    owner = "scale_by_kron"
    check_betas(owner, b1=b1)
    check_nonnegative(owner, precond_lr=precond_lr)
    check_range("precond_init_scale", precond_init_scale, 1e-30, owner=owner)
    if update_clip_rms is not None:
        check_range("update_clip_rms", update_clip_rms, 1e-30, owner=owner)
    if not callable(preconditioner_update_probability) and \
            preconditioner_update_probability is not None:
        check_range("preconditioner_update_probability", preconditioner_update_probability,
                    0.0, 1.0, high_inclusive=True, owner=owner)
    _check_options(owner, max_size_triangular, min_ndim_triangular, max_skew_triangular,
                   memory_save_mode)
    block_size = check_block_size(owner, block_size)
    check_dimension_numbers(weight_dimension_numbers, owner)
    check_bools(owner, merge_dims=merge_dims, group_same_shapes=group_same_shapes)
    prob = (precond_update_prob_schedule() if preconditioner_update_probability is None
            else preconditioner_update_probability)
    cfg = ks.KronConfig(owner, b1, normalize_grads, max_size_triangular, max_skew_triangular,
                        min_ndim_triangular, memory_save_mode, momentum_into_precond_update,
                        precond_lr, precond_init_scale, update_clip_rms, precond_dtype, mesh,
                        block_size, merge_dims, weight_dimension_numbers)

    def init_fn(params: Params) -> KronState:
        paths, leaves, treedef = ft.flatten_with_paths(params)
        ft.check_leaf_dtypes(paths, leaves, [True] * len(leaves), owner, "params")
        views = ks.views_of(cfg, params, leaves)
        qs = [ks.init_factors(cfg, p, ks.plan(cfg, jnp.shape(p), v))
              for p, v in zip(leaves, views)]
        return KronState(count=jnp.zeros([], jnp.int32), key=jax.random.PRNGKey(seed),
                         mu=ft.zeros_like(params, dtype=mu_dtype), qs=treedef.unflatten(qs))

    def update_fn(updates: Updates, state: KronState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, KronState]:
        del extra_args
        gs, mus, qs, views, treedef = _read_state(cfg, updates, state, params)
        # same-shape leaves as one stacked leaf (functrain.matrix.shape_groups)
        leaf_gs, leaf_mus, leaf_qs = gs, mus, qs
        grouping = shape_groups([group_key(*x[:3], static=x[3]) if group_same_shapes else None
                                 for x in zip(gs, mus, qs, views)])
        gs, mus = stack_units(grouping, gs), stack_units(grouping, mus)
        lays = [ks.plan(cfg, jnp.shape(g), stacked_view(views[m[0]], jnp.shape(leaf_gs[m[0]]),
                                                        len(m)))
                for g, m in zip(gs, grouping.units)]
        qs = stack_units(grouping, qs, [ks.factor_shapes(lay) for lay in lays])

        count = safe_increment(state.count)
        key, coin_key, noise_key = jax.random.split(state.key, 3)
        p_now = value_at(prob, state.count)
        do_update = jax.random.uniform(coin_key) < p_now
        cds, new_mus, ms, hs = ks.momentum(cfg, gs, mus, qs, lays,
                                           bias_correction_factor(b1, count))
        units, like, pieces = ks.cut_units(cfg, qs, cds, lays, ms, hs)
        members = ks.chunk_groups(units, cds, _GROUP_SAME_SHAPES)
        stacked_q, stacked_m, stacked_h = ks.stacked_arrays(cfg, members)
        stacked_q = ks.refresh_groups(cfg, members, units, like, grouping, len(gs), noise_key,
                                      do_update, stacked_q, stacked_h, _MAX_GATHER_ROWS)
        out, new_qs = ks.precondition_groups(cfg, members, stacked_q, stacked_m, gs, qs, pieces)
        ks.put_back_blocks(cfg, pieces, gs, qs, out, new_qs)
        return treedef.unflatten(unstack_units(grouping, out, leaf_gs)), KronState(
            count=count, key=key, mu=treedef.unflatten(unstack_units(grouping, new_mus, leaf_mus)),
            qs=treedef.unflatten(unstack_units(grouping, new_qs, leaf_qs)))

    return GradientTransformation(init_fn, update_fn)


@declare_optimizer("beyond optax", "Li, 2018", optax=None, stressed=True, summary=(
    "PSGD Kron (Li, 2018): learned Kronecker-factored triangular (or diagonal) preconditioners."),
    signature="kron(learning_rate=1e-3, b1=0.9, ..., precond_lr=0.1, max_size_triangular=8192)")
@hyperparameters(static=("max_size_triangular", "max_skew_triangular", "min_ndim_triangular",
                 "seed", "mesh", "block_size", "weight_dimension_numbers", "group_same_shapes"),
                 learning_rate="schedule", b1="number", weight_decay="schedule",
                 preconditioner_update_probability="schedule or None", max_size_triangular="number",
                 max_skew_triangular="bound or None", min_ndim_triangular="number",
                 precond_lr="number", precond_init_scale="number", update_clip_rms="number or None",
                 seed="number", block_size="number or None")
@shared_args()
def kron(learning_rate: ScalarOrSchedule = 0.001, b1: float = 0.9,
         weight_decay: ScalarOrSchedule = 0.0, weight_decay_mask: Optional[MaskOrFn] = None,
         normalize_grads: bool = False,
         preconditioner_update_probability: Optional[ScalarOrSchedule] = None,
         max_size_triangular: int = 8192, max_skew_triangular: Optional[float] = None,
         min_ndim_triangular: int = 2, memory_save_mode: Optional[str] = None,
         momentum_into_precond_update: bool = True, precond_lr: float = 0.1,
         precond_init_scale: float = 1.0, update_clip_rms: Optional[float] = 1.1,
         mu_dtype: Optional[Any] = None, precond_dtype: Optional[Any] = None,
         seed: int = 0, mesh: Optional[jax.sharding.Mesh] = None, *,
         block_size: Optional[int] = None, merge_dims: bool = False,
         weight_dimension_numbers: Any = None, group_same_shapes: bool = False,
         cautious_weight_decay: bool = False) -> GradientTransformation:
    """PSGD Kron (Li, 2018): momentum preconditioned by learned Kronecker factors.

    Update rule: ``u = `` :func:`scale_by_kron` 's clipped ``Q^H Q m`` (``m``
    the bias-corrected momentum, ``Q = Q_1 (x) ... (x) Q_k`` one triangular or
    diagonal factor per axis, learned by PSGD's whitening criterion with
    probability ``preconditioner_update_probability`` each step); then ``p -=
    learning_rate * (u + weight_decay * p)`` (decoupled weight decay).

    Defaults are the reference's (Li's psgd_torch ``kron``; Walters' psgd_jax
    used in AlgoPerf): ``learning_rate=0.001`` (the update's RMS stays about 1
    even near a minimum, where Adam's shrinks: decay the rate, and expect the
    best constant rate 3-10x below Adam's on small problems; docs/performance.md),
    ``b1=0.9``, ``precond_lr=0.1``, update probability 1.0
    for 500 steps annealed to 0.03, triangular factors up to 8192 per axis,
    RMS clip 1.1; see :func:`scale_by_kron` for every option.

    References: Xi-Lin Li, 2018, "Preconditioned Stochastic Gradient Descent"
    (IEEE TNNLS); Li, 2019, "Preconditioner on Matrix Lie Group for SGD".

    Args:
      learning_rate: the step size, a number or a schedule of the step count.
      b1: the momentum's decay, in ``[0, 1)``.
      weight_decay: decoupled weight decay (times ``learning_rate``), ``>= 0``.
      weight_decay_mask: where to decay: a tree (or prefix) of bools or a
        function of the params; ``None``: every leaf.
      normalize_grads: see :func:`scale_by_kron`.
      preconditioner_update_probability: see :func:`scale_by_kron`.
      max_size_triangular: see :func:`scale_by_kron`.
      max_skew_triangular: see :func:`scale_by_kron`.
      min_ndim_triangular: see :func:`scale_by_kron`.
      memory_save_mode: see :func:`scale_by_kron`.
      momentum_into_precond_update: see :func:`scale_by_kron`.
      precond_lr: see :func:`scale_by_kron`.
      precond_init_scale: see :func:`scale_by_kron`.
      update_clip_rms: see :func:`scale_by_kron`.
      mu_dtype: see :func:`scale_by_kron`.
      precond_dtype: see :func:`scale_by_kron`.
      seed: see :func:`scale_by_kron`.
      mesh: see :func:`scale_by_kron`.
      block_size: see :func:`scale_by_kron`.
      merge_dims: see :func:`scale_by_kron`.
      weight_dimension_numbers: stacked layers, each a leaf of its own (see
        :func:`scale_by_kron`).
      group_same_shapes: see :func:`scale_by_kron`.
      <shared: cautious_weight_decay>

    Returns:
      A ``GradientTransformation`` whose state is ``(KronState, <weight decay
      state>, <learning rate state>)``; ``update`` needs the params.

    >>> import jax, jax.numpy as jnp, functrain
    >>> f = lambda p: jnp.sum(jnp.array([[1., 2.], [3., 4.]]) * p['w'] ** 2)
    >>> opt = functrain.contrib.kron(learning_rate=0.1)
    >>> params = {'w': jnp.ones((2, 2))}
    >>> state = opt.init(params)
    >>> @jax.jit
    ... def step(params, state):
    ...     updates, state = opt.update(jax.grad(f)(params), state, params)
    ...     return functrain.apply_updates(params, updates), state
    >>> for _ in range(20):
    ...     params, state = step(params, state)
    >>> bool(f(params) < 0.5)
    True
    """
    check_range("weight_decay", weight_decay, 0.0, owner="kron")
    return chain(
        scale_by_kron(b1, normalize_grads, preconditioner_update_probability,
                      max_size_triangular, max_skew_triangular, min_ndim_triangular,
                      memory_save_mode, momentum_into_precond_update, precond_lr,
                      precond_init_scale, update_clip_rms, mu_dtype, precond_dtype, seed, mesh,
                      block_size=block_size, merge_dims=merge_dims,
                      weight_dimension_numbers=weight_dimension_numbers,
                      group_same_shapes=group_same_shapes),
        add_decayed_weights(weight_decay, weight_decay_mask,
                            cautious=cautious_weight_decay),
        scale_by_learning_rate(learning_rate))
