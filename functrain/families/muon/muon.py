"""Muon: momentum orthogonalized by Newton-Schulz iterations, and AdamW for the other leaves.

``scale_by_muon`` is one per-leaf stage on functrain's engine: the momentum of
one weight, its bias correction (Nesterov's look-ahead by default) and the
Newton-Schulz orthogonalization of that weight, viewed as one matrix per
:class:`MuonDimensionNumbers` (reduction axes x output axes; every other axis
is a batch axis whose matrices are orthogonalized independently). When leaves
need different dimension numbers (a tree or a function of the params), one
stage runs per distinct value, each masked to its leaves, in a single pass.

The Newton-Schulz loop is a ``lax.fori_loop`` (or a ``lax.scan`` over
per-step coefficients), never unrolled, so its temporary memory does not grow
with ``ns_steps``. ``muon`` sends the leaves Muon handles (the 2-D ones, or
those given dimension numbers) to Muon and the others to AdamW, with
optax.contrib 0.2.8's arguments, defaults, state layout and numbers.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from functrain.linalg import (CHUNK_BYTES, NS_METHODS, PRECONDITIONINGS, check_ns_dtype,
                              map_stacks, newton_schulz, newton_schulz_coefficients)
from functrain.arg_checks import check_betas, check_nonnegative, check_range, check_state_type
from functrain.declarations import declare_optimizer, hyperparameters, state_value_kinds
from functrain import jax_compat, tree as ft
from functrain.numerics import ema_update, nesterov_mu_hat
from functrain.families.adam.optimizers import adamw
from functrain.matrix.dimension_numbers import (MuonDimensionNumbers, check_dims_type, dims_key,
                                                dims_of_leaves, dims_of_slots, is_dims, leaf_axes,
                                                matrix_view)
from functrain.engine.counts import corrections
from functrain.engine.protocol import (GradientTransformation, MaskOrFn, Params, ScalarOrSchedule,
                                       Updates)
from functrain.engine.stage import LeafStage
from functrain.engine.program import chain, leaf_compute_dtype, run_block, stage_transform
from functrain.transforms.scaling import add_decayed_weights, scale_by_learning_rate
from functrain.wrappers.masking import PartitionState, masked
from functrain.docstrings import shared_args

Array = jax.Array
# A (3,) triple used at every step, or one triple per step: ((a, b, c), ...); muon also
# takes a preset's name.
NsCoeffs = Any

_STANDARD_NS_COEFFS = tuple(newton_schulz_coefficients("standard")[0].tolist())


@state_value_kinds(mu="signed")
class MuonState(NamedTuple):
    """State of :func:`scale_by_muon`: step count, momentum, Newton-Schulz coefficients.

    Attributes:
      count: the number of steps taken (int32).
      mu: the momentum, a tree like the params.
      ns_coeffs: the coefficients, ``(3,)`` or one row per step ``(n, 3)``.

    >>> import jax.numpy as jnp
    >>> scale_by_muon().init({'w': jnp.zeros((2, 3))}).ns_coeffs
    Array([ 3.4445, -4.775 ,  2.0315], dtype=float32)
    """

    count: Array
    mu: Any
    ns_coeffs: Array


# Dimension numbers are resolved and checked per leaf by functrain.matrix.dimension_numbers.
_DEFAULT_DIMS = MuonDimensionNumbers(-2, -1)  # scale_by_muon's default: the last two axes


# --------------------------------------------------------------------------
# Newton-Schulz over the tree
# --------------------------------------------------------------------------

def orthogonalize_tree(tree: Any, dims: list, coeffs: Array, ns_steps: Any,
                        preconditioning: str, eps: Any, adaptive: bool, owner: str,
                        mesh: Optional[jax.sharding.Mesh] = None, method: str = "standard",
                        safety: float = 1.0, ns_dtype: Optional[Any] = None) -> Any:
    """Muon's direction for every leaf of ``tree`` (``dims``: each array leaf's numbers).

    Every leaf is a stack of ``(rows, cols)`` matrices (transposed so that
    rows <= cols); the stacks of one shape and dtype are concatenated and run
    one Newton-Schulz loop of batched matmuls per chunk of at most ``CHUNK_BYTES``: a
    transformer's dozens of equal matrices cost a few GEMMs, and the program does not grow
    with the leaves. With ``mesh``
    each stack is divided over its devices (:func:`functrain.linalg.map_stacks`).
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=ft.is_placeholder)
    dims = iter(dims)
    views, mats, specs = {}, {}, {}
    groups: dict = {}  # (rows, cols, dtype) -> leaf indices, in order
    for i, x in enumerate(leaves):
        if ft.is_placeholder(x):
            continue
        red, out = leaf_axes(next(dims), x.shape, f"of shape {x.shape}", owner)
        # On a mesh with explicit axes a leaf carries its sharding in its type, and a
        # matmul contracting a split axis must be told its output's: Newton-Schulz needs
        # whole matrices anyway, so it runs on a replicated copy, and the direction goes
        # back to the leaf's sharding at the end.
        specs[i] = ft.explicit_spec(x)
        if specs[i] is not None:
            x = jax_compat.reshard(x, jax.sharding.PartitionSpec())
        view = views[i] = matrix_view(x.shape, red, out)
        m = jnp.transpose(x, view.perm).reshape(view.sizes)
        mats[i] = m
        o = jnp.swapaxes(m, -1, -2) if view.swapped else m
        groups.setdefault((o.shape[1:], o.dtype), []).append((i, o))
    done = {}
    for members in groups.values():
        stack = jnp.concatenate([o for _, o in members]) if len(members) > 1 else members[0][1]
        result = map_stacks(lambda s, c, e: newton_schulz(
            s, c, ns_steps, preconditioning, e, method=method, safety_factor=safety,
            dtype=ns_dtype),
            stack, mesh=mesh, shared=(coeffs, eps), chunk_bytes=CHUNK_BYTES)
        start = 0
        for i, o in members:
            done[i] = result[start:start + o.shape[0]]
            start += o.shape[0]
    out_leaves = list(leaves)
    for i, o in done.items():
        view, m, x = views[i], mats[i], leaves[i]
        o = jnp.swapaxes(o, -1, -2) if view.swapped else o
        if adaptive:  # scaled by the dual norm <M, O> of each matrix (Bernstein et al., 2024)
            o = jnp.sum(jnp.conj(m) * o, axis=(-2, -1), keepdims=True) * o
        o = jnp.transpose(o.reshape([x.shape[a] for a in view.perm]), np.argsort(view.perm))
        out_leaves[i] = o if specs[i] is None else jax_compat.reshard(o, specs[i])
    return treedef.unflatten(out_leaves)


# --------------------------------------------------------------------------
# The stages, and one stage per distinct dimension numbers
# --------------------------------------------------------------------------

def _check_leaves_prepare(dims: MuonDimensionNumbers, prepare: Callable, owner: str
                          ) -> Callable:
    """``prepare`` that first checks every (active) leaf fits ``dims``, naming its path."""
    def checked(glob: dict, updates: Any, **extra: Any) -> tuple:
        dims_of_leaves(dims, updates, owner, "weight_dimension_numbers")
        return prepare(glob, updates, **extra)
    return checked


def in_compute_dtype(updates: Updates, params: Optional[Params], owner: str) -> Updates:
    """The floating leaves of ``updates`` in the engine's compute dtype (with ``params``).

    Fed these, the momentum stage returns its output unrounded (16-bit leaves stay float32)
    for the whole-tree Newton-Schulz, as in one fused pass. Placeholders and trees that do
    not fit ``params`` (the engine then names the mismatch) pass as they are; an integer or
    bool leaf is a ``TypeError`` naming it and ``owner`` (the Muon family's own update
    casts its result to each gradient's dtype, which would truncate it).
    """
    paths, gs, _ = ft.flatten_with_paths(updates)
    ft.check_leaf_dtypes(paths, gs, [True] * len(gs), owner, "updates")
    leaves, treedef = jax.tree_util.tree_flatten(updates, is_leaf=ft.is_placeholder)
    try:
        ps = [None] * len(leaves) if params is None else treedef.flatten_up_to(params)
    except (ValueError, TypeError):
        return updates
    out = []
    for g, p in zip(leaves, ps):
        if (ft.is_placeholder(g) or (params is not None and ft.is_placeholder(p))
                or not jnp.issubdtype(jnp.result_type(g), jnp.inexact)):
            out.append(g)
        else:
            g = jnp.asarray(g)
            out.append(g.astype(leaf_compute_dtype(g, None if p is None else jnp.asarray(p))))
    return treedef.unflatten(out)


def per_dims(spec: Any, build: Callable[[MuonDimensionNumbers], LeafStage], owner: str,
              name: str) -> GradientTransformation:
    """``build``'s stage per leaf's dimension numbers: fused for one value, grouped otherwise."""
    if spec is None or is_dims(spec):
        dims = _DEFAULT_DIMS if spec is None else spec
        check_dims_type(dims, owner, name)
        stage = build(dims)
        return stage_transform(dataclasses.replace(
            stage, needs_updates=True, prepare=_check_leaves_prepare(dims, stage.prepare, owner)))

    def init_fn(params: Params) -> Any:
        return build(_DEFAULT_DIMS).init_state(params)

    def update_fn(updates: Updates, state: Any, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, Any]:
        dims = dims_of_leaves(spec, updates, owner, name)
        groups = {dims_key(d): d for d in dims} or {None: _DEFAULT_DIMS}
        flat = iter(dims)
        owners = [None if ft.is_placeholder(x) else dims_key(next(flat))
                  for x in jax.tree_util.tree_leaves(updates, is_leaf=ft.is_placeholder)]
        structure = jax.tree_util.tree_structure(updates, is_leaf=ft.is_placeholder)
        stages = [dataclasses.replace(build(d), mask=structure.unflatten(
            [o == key for o in owners])) for key, d in groups.items()]
        new_updates, news = run_block(stages, updates, [state] * len(stages), params,
                                      extra_args)
        stage = stages[0]
        if stage.state_cls is None:
            return new_updates, news[0]
        keys = [o for o in owners if o is not None]
        index = {key: k for k, key in enumerate(groups)}
        fields = {f: getattr(news[0], f) for f in stage.global_fields}
        for f in stage.leaf_fields:
            per_stage = [jax.tree_util.tree_leaves(getattr(n, f)) for n in news]
            fields[f] = jax.tree_util.tree_structure(getattr(news[0], f)).unflatten(
                [per_stage[index[key]][i] for i, key in enumerate(keys)])
        return new_updates, stage.state_cls(**fields)

    return GradientTransformation(init_fn, update_fn)


def resolve_coeffs(ns_coeffs: NsCoeffs, ns_steps: Any, owner: str) -> tuple[Any, float]:
    """The coefficients, (3,) or (n, 3) (a preset's name resolved), checked, and the
    normalization's safety factor (:func:`functrain.linalg.newton_schulz_coefficients`)."""
    safety = 1.0
    if isinstance(ns_coeffs, str):
        ns_coeffs, safety = newton_schulz_coefficients(ns_coeffs, ns_steps, owner=owner,
                                                       arg="ns_coeffs")
    coeffs = np.asarray(ns_coeffs, np.float32) if not isinstance(ns_coeffs, jax.Array) \
        else ns_coeffs
    if coeffs.ndim not in (1, 2) or coeffs.shape[-1] != 3:
        raise ValueError(f"{owner}: ns_coeffs must have shape (3,) or (n, 3) (one row per "
                         f"Newton-Schulz step), got shape {coeffs.shape}.")
    steps = None if isinstance(ns_steps, jax.core.Tracer) else ns_steps
    if coeffs.ndim == 2 and steps is not None and coeffs.shape[0] > steps:
        raise ValueError(f"{owner}: ns_coeffs has {coeffs.shape[0]} rows (one per step) but "
                         f"ns_steps is {steps}: pass ns_steps >= {coeffs.shape[0]}.")
    return ns_coeffs, safety


def check_options(owner: str, ns_steps: Any, preconditioning: str, ns_method: str = "standard",
                  ns_dtype: Optional[Any] = None) -> None:
    """Checks ``ns_steps``, ``preconditioning``, ``ns_method`` and ``ns_dtype`` for ``owner`` (a
    builder of the Muon family, whose ``@hyperparameters`` declare ``ns_steps`` an ``"int"``),
    raising an error that names the argument."""
    check_range("ns_steps", ns_steps, 0.0, owner=owner)
    if preconditioning not in PRECONDITIONINGS:
        raise ValueError(f"{owner}: preconditioning must be one of {list(PRECONDITIONINGS)}, "
                         f"got {preconditioning!r}.")
    if ns_method not in NS_METHODS:
        raise ValueError(f"{owner}: ns_method must be one of {list(NS_METHODS)}, got "
                         f"{ns_method!r}.")
    check_ns_dtype(ns_dtype, ns_method, owner, ("ns_dtype", "ns_method", "the updates'"))
    if ns_method == "gram" and isinstance(ns_steps, jax.core.Tracer):
        raise ValueError(f"{owner}: ns_method='gram' needs a static ns_steps (inject_hyperparams"
                         f": static_args=('ns_steps',)).")


@hyperparameters(static=("mesh", "ns_dtype"), ns_steps="int", beta="number", eps="number")
@shared_args()
def scale_by_muon(ns_coeffs: NsCoeffs = _STANDARD_NS_COEFFS, ns_steps: int = 5,
                  beta: float = 0.95, eps: float = 1e-8, mu_dtype: Optional[Any] = None, *,
                  nesterov: bool = True, adaptive: bool = False,
                  preconditioning: str = "frobenius", weight_dimension_numbers: Any = None,
                  mesh: Optional[jax.sharding.Mesh] = None, ns_method: str = "standard",
                  ns_dtype: Optional[Any] = None) -> GradientTransformation:
    """Rescale updates by Muon: orthogonalized momentum (Jordan, 2024).

    Update rule, per leaf: ``mu = beta mu + (1 - beta) g``; ``m = beta mu /
    (1 - beta**(t+1)) + (1 - beta) g / (1 - beta**t)`` (Nesterov; else ``mu /
    (1 - beta**t)``); each matrix ``M`` of ``m`` (see
    :class:`MuonDimensionNumbers`) becomes ``O = NS(M / (||M||_F + eps))``,
    ``ns_steps`` quintic Newton-Schulz steps ``X <- a X + (b A + c A A) X`` with
    ``A = X X^H``, an approximate ``U V^H`` of ``M = U S V^H``. With
    ``adaptive``, ``O <- <M, O> O`` (Bernstein & Newhouse, 2024).

    The loop is a ``lax.fori_loop`` (a ``lax.scan`` for per-step coefficients),
    so memory does not grow with ``ns_steps``. Beyond optax: leaves may have
    batch axes (each matrix orthogonalized apart; ``adaptive`` then scales
    each matrix by its own ``<M, O>``), and ``None`` (the default) treats the
    last two axes as the matrix and leading axes as stacked layers (optax
    accepts only 2-D leaves there).

    References: Jordan, 2024, "Muon: An optimizer for hidden layers in neural
    networks" (modded-nanogpt); Bernstein & Newhouse, 2024, "Old Optimizer, New
    Norm: An Anthology"; Ahn et al., 2025, "Dion" (the ``'dion'`` coefficients); Amsel et
    al., 2025, "The Polar Express" (arXiv 2505.16932); Zhang, Amsel, Chen & Dao, 2026,
    "Gram Newton-Schulz" (``ns_method='gram'``).

    Args:
      ns_coeffs: the Newton-Schulz coefficients ``(a, b, c)`` of every step,
        or one triple per step ``((a, b, c), ...)`` (then the iteration runs
        once per row; ``ns_steps`` must be at least the number of rows), or a
        preset's name: ``'standard'`` (the default triple), ``'dion'`` or
        ``'polar_express'`` (``ns_steps`` rows: Polar Express's five, then the steady
        quintic; the momentum divided by ``1.02 ||M||_F + eps``, as modded-nanogpt;
        :func:`functrain.linalg.newton_schulz_coefficients`).
      <shared: ns_steps>
      beta: the momentum's decay rate, in ``[0, 1)``.
      eps: added to the norm the momentum is divided by before the iteration.
      <shared: mu_dtype>
      nesterov: use Nesterov's look-ahead momentum (default ``True``).
      adaptive: scale each orthogonalized matrix by ``<M, O>``.
      preconditioning: how the matrix is scaled before the iteration:
        ``'frobenius'`` (default), ``'spectral'`` (its largest singular value),
        ``'aol'`` (Boissin et al., 2025) or ``'schatten'`` (Schatten-4 norm;
        Grishina et al., 2025); the last two replace the first step's input
        scaling (with complex leaves, ``'schatten'`` uses ``X X^H``).
      weight_dimension_numbers: the matrix axes of each leaf: ``None`` (the
        last two axes of every leaf), one :class:`MuonDimensionNumbers` for
        every leaf, a tree of them shaped like the params (or a prefix), or a
        function of the updates returning one.
      mesh: a ``jax.sharding.Mesh`` (beyond optax): each stack of same-shape matrices is
        divided over its devices for Newton-Schulz (each device orthogonalizes ``1/N`` of
        them, the results are gathered); ``None``: every device does all of them.
      ns_method: ``'standard'`` or ``'gram'``: the same steps through ``M M^H``, fewer
        flops for matrices more than 1.5 times wider than tall
        (:func:`functrain.linalg.newton_schulz`); needs a static ``ns_steps``.
      ns_dtype: the dtype the Newton-Schulz steps run in (beyond optax): ``jnp.bfloat16``
        for the accelerators' fast matmuls, as modded-nanogpt runs them (the normalization
        stays in the updates' dtype; the singular values land in float32's band, the
        direction differs from float32's by 3-9%, :func:`functrain.linalg.newton_schulz`);
        ``None``: the updates' compute dtype. Not with ``ns_method='gram'``.

    Returns:
      A ``GradientTransformation`` whose state is :class:`MuonState`.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_muon()
    >>> g = {'w': jnp.array([[3., 0.], [0., 4.]])}
    >>> u, state = tx.update(g, tx.init(g))
    >>> [round(float(x), 2) for x in jnp.diag(u['w'])]  # singular values 3, 4: about 1
    [0.72, 1.12]
    """
    owner = "scale_by_muon"
    check_betas(owner, beta=beta)
    check_nonnegative(owner, eps=eps)
    check_options(owner, ns_steps, preconditioning, ns_method, ns_dtype)
    coeffs, safety = resolve_coeffs(ns_coeffs, ns_steps, owner)
    bias = corrections(beta, nesterov=nesterov)

    def prepare(glob: dict, updates: Any) -> tuple:
        bc, counted = bias(glob, updates)
        return bc, {**counted, "ns_coeffs": glob["ns_coeffs"]}

    def build(dims: MuonDimensionNumbers) -> LeafStage:
        def leaf(g: Array, s: Any, p: Any, bc: Any) -> tuple:
            leaf_axes(dims, g.shape, f"of shape {g.shape}", owner)
            mu = ema_update(g, s.mu, beta)
            m = nesterov_mu_hat(g, mu, beta, bc.mu, bc.next_mu) if nesterov else mu / bc.mu
            return m, s._replace(mu=mu)

        return LeafStage(
            name=owner, update_leaf=leaf, state_cls=MuonState, leaf_fields=("mu",),
            init_leaf=lambda p: (ft.zeros_like(p, mu_dtype),), prepare=prepare,
            init_global=lambda: {"count": jnp.zeros([], jnp.int32),
                                 # JAX's default float (float64 under x64), as optax
                                 "ns_coeffs": jnp.asarray(coeffs, float)})

    # The momentum: a per-leaf engine stage (checks, state layout, masks), fed the updates
    # in their compute dtype so Newton-Schulz, over the whole tree, gets it unrounded.
    momentum = per_dims(weight_dimension_numbers, build, owner, "weight_dimension_numbers")
    spec = _DEFAULT_DIMS if weight_dimension_numbers is None else weight_dimension_numbers

    def update_fn(updates: Updates, state: Any, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, Any]:
        check_state_type(state, MuonState, owner)
        m, new_state = momentum.update(in_compute_dtype(updates, params, owner), state, params,
                                       **extra_args)
        dims = dims_of_leaves(spec, m, owner, "weight_dimension_numbers")
        o = orthogonalize_tree(m, dims, state.ns_coeffs, ns_steps, preconditioning, eps,
                                adaptive, owner, mesh, ns_method, safety, ns_dtype)
        return jax.tree.map(lambda o, g: o if ft.is_placeholder(g) else o.astype(g.dtype),
                            o, updates, is_leaf=ft.is_placeholder), new_state

    return type(momentum)(momentum.init, update_fn)


def scale_by_shape(spec: Any, consistent_rms: Optional[Any]) -> GradientTransformation:
    """Muon's per-shape scale: ``sqrt(max(1, fan_out/fan_in))``, or ``sqrt(max(fan_in,
    fan_out)) * consistent_rms`` (Liu et al., 2025), fans from the dimension numbers."""
    owner = "muon (shape scaling)"

    def build(dims: MuonDimensionNumbers) -> LeafStage:
        def leaf(g: Array, s: Any, p: Any, ctx: Any) -> tuple:
            red, out = leaf_axes(dims, g.shape, f"of shape {g.shape}", owner)
            fan_in = math.prod(g.shape[a] for a in red)
            fan_out = math.prod(g.shape[a] for a in out)
            if consistent_rms is None:
                return jnp.sqrt(jnp.maximum(1, fan_out / fan_in)) * g, ()
            return jnp.sqrt(jnp.maximum(fan_in, fan_out)) * consistent_rms * g, ()
        return LeafStage(name=owner, update_leaf=leaf)

    return per_dims(spec, build, owner, "muon_weight_dimension_numbers")


# --------------------------------------------------------------------------
# muon: Muon for the matrices, AdamW for the rest
# --------------------------------------------------------------------------

def split_muon_adam(muon_tx: GradientTransformation, adam_tx: GradientTransformation,
           spec: Any) -> GradientTransformation:
    """optax's ``partition({'muon': ..., 'adam': ...})``; either group may be empty."""
    def group(is_muon: bool) -> Callable[[Any], Any]:
        def mask_fn(tree: Any) -> Any:
            slots = jax.tree_util.tree_leaves(tree, is_leaf=ft.is_placeholder)
            if spec is None:
                flags = [not ft.is_placeholder(x) and np.ndim(x) == 2 for x in slots]
            else:
                flags = [d is not None for d in dims_of_slots(
                    spec, tree, "muon", "muon_weight_dimension_numbers")]
            return jax.tree_util.tree_structure(tree, is_leaf=ft.is_placeholder).unflatten(
                [f == is_muon for f in flags])
        return mask_fn

    groups = {"muon": masked(muon_tx, group(True)), "adam": masked(adam_tx, group(False))}

    def init_fn(params: Params) -> PartitionState:
        return PartitionState({label: tx.init(params) for label, tx in groups.items()})

    def update_fn(updates: Updates, state: PartitionState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, PartitionState]:
        check_state_type(state, PartitionState, "muon")
        new = {}
        for label, tx in groups.items():
            updates, new[label] = tx.update(updates, state.inner_states[label], params,
                                            **extra_args)
        return updates, PartitionState(new)

    return GradientTransformation(init_fn, update_fn)


def muon_family(direction: Sequence[GradientTransformation], learning_rate: ScalarOrSchedule,
                weight_decay: ScalarOrSchedule, weight_decay_mask: Optional[MaskOrFn],
                adam_tx: GradientTransformation, spec: Any, *,
                cautious: bool = False) -> GradientTransformation:
    """How the Muon family's named optimizers are assembled: on the leaves ``spec`` selects
    (:func:`split_muon_adam`), ``direction`` (the orthogonalized step and its scaling), then
    decoupled weight decay and the learning rate; ``adam_tx`` on the other leaves.

    Args:
      direction: the transformations giving the direction, in order.
      learning_rate: a number or a schedule.
      weight_decay: decoupled weight decay (a number or schedule).
      weight_decay_mask: which of those leaves get weight decay.
      adam_tx: the transformation of the other leaves.
      spec: the dimension numbers argument as the user gave it (``None``: the 2-D leaves).
      cautious: Cautious Weight Decay for ``weight_decay`` (the ``cautious`` of
        :func:`functrain.add_decayed_weights`); default ``False``.

    Returns:
      optax's ``partition({'muon': ..., 'adam': ...})`` of the two.

    >>> import jax.numpy as jnp, functrain
    >>> opt = muon_family([functrain.scale(1.0)], 0.5, 0.0, None, functrain.sgd(0.1), None)
    >>> params = {'w': jnp.ones((1, 1)), 'b': jnp.ones(1)}
    >>> opt.update(params, opt.init(params), params)[0]  # 'w' is 2-D: the Muon side
    {'b': Array([-0.1], dtype=float32), 'w': Array([[-0.5]], dtype=float32)}
    """
    muon_tx = chain(*direction,
                    add_decayed_weights(weight_decay, weight_decay_mask, cautious=cautious),
                    scale_by_learning_rate(learning_rate))
    return split_muon_adam(muon_tx, adam_tx, spec)


@declare_optimizer("contrib", "Jordan et al., 2024", optax="contrib", stressed=True, summary=(
    "Muon (Jordan et al., 2024): momentum orthogonalized by Newton-Schulz on 2-D leaves, AdamW "
    "on the others; `MuonDimensionNumbers` for stacked layers and conv kernels."), signature=(
    "muon(learning_rate, ns_coeffs=..., ns_steps=5, beta=0.95, ..., adam_b1=0.9, adam_b2=0.999, "
    "...)"))
@hyperparameters(static=("mesh", "ns_dtype"), learning_rate="schedule", ns_steps="int",
                 beta="number", eps="number", weight_decay="schedule", adam_b1="number",
                 adam_b2="decay", adam_eps_root="number", adam_weight_decay="schedule",
                 adam_learning_rate="schedule or None", consistent_rms="number or None")
@shared_args()
def muon(learning_rate: ScalarOrSchedule, ns_coeffs: NsCoeffs = _STANDARD_NS_COEFFS,
         ns_steps: int = 5, beta: float = 0.95, eps: float = 1e-8,
         weight_decay: ScalarOrSchedule = 0.0, weight_decay_mask: Optional[MaskOrFn] = None,
         mu_dtype: Optional[Any] = None, *, nesterov: bool = True, adaptive: bool = False,
         preconditioning: str = "frobenius", adam_b1: float = 0.9, adam_b2: float = 0.999,
         adam_eps_root: float = 0.0, adam_weight_decay: ScalarOrSchedule = 0.0,
         adam_learning_rate: Optional[ScalarOrSchedule] = None,
         muon_weight_dimension_numbers: Any = None,
         consistent_rms: Optional[float] = None,
         mesh: Optional[jax.sharding.Mesh] = None,
         ns_method: str = "standard", ns_dtype: Optional[Any] = None,
         cautious_weight_decay: bool = False) -> GradientTransformation:
    """Muon (Jordan, 2024): orthogonalized momentum for matrices, AdamW for the other leaves.

    Update rule for a Muon leaf: ``O`` = :func:`scale_by_muon`'s orthogonalized
    momentum; ``p -= lr * (s O + weight_decay * p)`` with ``s = sqrt(max(1,
    fan_out / fan_in))``, or ``s = sqrt(max(fan_in, fan_out)) * consistent_rms``
    (Liu et al., 2025, "Muon is Scalable for LLM Training"), where ``fan_in`` /
    ``fan_out`` are the sizes of the reduction / output axes. Other leaves:
    ``adamw(adam_learning_rate, adam_b1, adam_b2, eps, adam_eps_root,
    weight_decay=adam_weight_decay, nesterov=nesterov)``.

    Which leaves are Muon's: with ``muon_weight_dimension_numbers=None`` the
    2-D ones (as optax; stacked layers ``(L, m, n)`` and conv kernels go to
    AdamW unless given dimension numbers, e.g. ``MuonDimensionNumbers(-2, -1)``
    for a leading layer axis); otherwise those whose entry is not ``None``.

    References: Jordan, 2024, "Muon: An optimizer for hidden layers in neural
    networks"; Bernstein & Newhouse, 2024, "Old Optimizer, New Norm".

    Args:
      learning_rate: Muon's step size, a number or a schedule of the step count.
      ns_coeffs: Newton-Schulz coefficients: a triple, one triple per step, or
        a preset's name (``'standard'``, ``'dion'``, ``'polar_express'``); see
        :func:`scale_by_muon`.
      <shared: ns_steps>
      beta: the momentum's decay rate, in ``[0, 1)``.
      eps: Muon's normalization epsilon, also AdamW's ``eps``.
      weight_decay: decoupled weight decay of the Muon leaves (multiplied by
        ``learning_rate``), ``>= 0``.
      weight_decay_mask: where to apply ``weight_decay`` among the Muon leaves:
        a tree (or prefix) of bools or a function of the params; ``None``: all.
      mu_dtype: storage dtype of both optimizers' first moments.
      nesterov: Nesterov momentum, for Muon and AdamW alike (default ``True``).
      adaptive: scale the orthogonalized update by ``<M, O>``.
      preconditioning: ``'frobenius'``, ``'spectral'``, ``'aol'`` or
        ``'schatten'``; see :func:`scale_by_muon`.
      <shared: adam_b1>
      adam_b2: AdamW's second-moment decay, or a decay-rate schedule
        (``functrain.contrib.palm_beta2_schedule()``).
      <shared: adam_eps_root, adam_weight_decay, adam_learning_rate>
      muon_weight_dimension_numbers: ``None`` (the 2-D rule above), one
        :class:`MuonDimensionNumbers` for every leaf, a tree of them and
        ``None`` (AdamW) shaped like the params or a prefix, or a function of
        the params returning one.
      consistent_rms: ``None`` (width scaling) or the target RMS of the update
        (0.2 matches AdamW's).
      mesh: divide Newton-Schulz over this mesh's devices (beyond optax; see
        :func:`scale_by_muon`).
      ns_method: ``'standard'`` or ``'gram'`` (see :func:`scale_by_muon`).
      ns_dtype: the dtype Newton-Schulz runs in, e.g. ``jnp.bfloat16`` (beyond optax; see
        :func:`scale_by_muon`); ``None``: the updates'.
      cautious_weight_decay: apply the weight decay only where the update and the param
        agree in sign (Cautious Weight Decay, Chen et al., 2025; see
        :func:`functrain.add_decayed_weights`), to ``weight_decay`` and
        ``adam_weight_decay`` alike; default ``False``.

    Returns:
      A ``GradientTransformation`` whose state is ``PartitionState`` with the
      entries ``'muon'`` (``MaskedState((MuonState, EmptyState, EmptyState,
      EmptyState))``) and ``'adam'`` (AdamW's masked state), as optax's.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.muon(0.02)
    >>> params = {'w': jnp.ones((4, 3)), 'b': jnp.zeros(3)}
    >>> state = opt.init(params)
    >>> u, state = opt.update({'w': jnp.eye(4, 3), 'b': jnp.ones(3)}, state, params)
    >>> [round(float(x), 4) for x in (u['w'][0, 0], u['b'][0])]  # Muon's, AdamW's
    [-0.0137, -0.0295]
    """
    owner = "muon"
    check_betas(owner, beta=beta, adam_b1=adam_b1, adam_b2=adam_b2)
    check_nonnegative(owner, eps=eps, adam_eps_root=adam_eps_root)
    check_range("weight_decay", weight_decay, 0.0, owner=owner)
    if consistent_rms is not None:
        check_range("consistent_rms", consistent_rms, 0.0, owner=owner)
    check_options(owner, ns_steps, preconditioning, ns_method, ns_dtype)
    resolve_coeffs(ns_coeffs, ns_steps, owner)  # checked here, resolved by scale_by_muon
    spec = (MuonDimensionNumbers() if muon_weight_dimension_numbers is None
            else muon_weight_dimension_numbers)
    direction = [scale_by_muon(ns_coeffs, ns_steps, beta, eps, mu_dtype, nesterov=nesterov,
                               adaptive=adaptive, preconditioning=preconditioning,
                               weight_dimension_numbers=spec, mesh=mesh, ns_method=ns_method,
                               ns_dtype=ns_dtype),
                 scale_by_shape(spec, consistent_rms)]
    adam_tx = adamw(learning_rate if adam_learning_rate is None else adam_learning_rate,
                    b1=adam_b1, b2=adam_b2, eps=eps, eps_root=adam_eps_root, mu_dtype=mu_dtype,
                    weight_decay=adam_weight_decay, nesterov=nesterov,
                    cautious_weight_decay=cautious_weight_decay)
    return muon_family(direction, learning_rate, weight_decay, weight_decay_mask, adam_tx,
                       muon_weight_dimension_numbers, cautious=cautious_weight_decay)


__all__ = ["MuonDimensionNumbers", "MuonState", "scale_by_muon", "muon"]
