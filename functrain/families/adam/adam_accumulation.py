"""Adam accumulation: gradient accumulation into Adam's moments, without a gradient buffer.

``MultiSteps(adamw(...), N)`` keeps a parameter-sized buffer for the running mean of the
``N`` micro-batch gradients, beside Adam's two moments (three parameter-sized trees).
AdamA (Zhang et al., 2023, arXiv:2305.19982) adds each micro-batch gradient into the
moments themselves as it comes, so the gradient can be freed at once and the state holds
two parameter-sized trees: ``mu`` is exactly Adam's first moment of the mean gradient,
``nu`` is the moving average of the *mean of the squared* micro-batch gradients (the
"batch size invariant Adam" of Wang & Aitchison, 2024, arXiv:2402.18824: first square the
micro-batch gradients, then average) instead of the square of their mean, which would
need the buffer.

On functrain's engine it is one :class:`~functrain.engine.stage.LeafStage`
(:func:`scale_by_adam_accumulation`: the moments, Adam's direction on every ``N``-th call
and zeros on the others) chained with the shared decoupled weight decay and learning rate,
whose values are taken at the optimizer step (``count // N``) and, for the decay, applied
on the ``N``-th call only. The three run fused, in one pass over the tree.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain import tree as ft
from functrain.arg_checks import (check_betas, check_bools, check_nonnegative, check_range,
                                  concrete_real)
from functrain.declarations import declare_optimizer, hyperparameters, state_value_kinds
from functrain.engine.program import chain, identity, stage_transform
from functrain.engine.protocol import (GradientTransformation, GradientTransformationExtraArgs,
                                       MaskOrFn, ScalarOrSchedule)
from functrain.engine.stage import LeafStage
from functrain.engine.counts import BiasCorrections, corrections, safe_increment, value_at
from functrain.numerics import abs_sq, adam_direction
from functrain.transforms.scaling import add_decayed_weights, scale_by_learning_rate
from functrain.docstrings import shared_args

Array = jax.Array

__all__ = ["ScaleByAdamAccumulationState", "AccumulatingGradientTransformation",
           "scale_by_adam_accumulation", "adam_accumulation"]


@state_value_kinds(mu="signed", nu="unsigned")
class ScaleByAdamAccumulationState(NamedTuple):
    """State of :func:`scale_by_adam_accumulation`: two counters and Adam's two moments.

    Attributes:
      mini_step: micro-batches taken since the last optimizer step (int32, from 0 to
        ``num_micro_batches - 1``), as ``MultiStepsState.mini_step``.
      count: the number of optimizer steps taken (int32): the ``t`` of the bias
        corrections.
      mu: the first moment, a tree like the params.
      nu: the second moment (of the mean squared micro-batch gradient), a tree like the
        params.

    >>> import jax.numpy as jnp
    >>> scale_by_adam_accumulation(4).init({'w': jnp.zeros(2)}).mini_step
    Array(0, dtype=int32)
    """

    mini_step: Array
    count: Array
    mu: Any
    nu: Any


class _Context(NamedTuple):
    """One call's scalars: whether it emits, the moments' keep factors and weights."""
    emit: Array
    keep_mu: Any
    keep_nu: Any
    mu_weight: Any
    nu_weight: Any
    corrections: BiasCorrections


def _checked_micro_batches(owner: str, num_micro_batches: Any) -> Any:
    """``num_micro_batches`` as a Python int when concrete (checked ``>= 1``)."""
    check_range("num_micro_batches", num_micro_batches, 1.0, owner=owner)
    return num_micro_batches if concrete_real(num_micro_batches) is None else int(
        num_micro_batches)


def _find_state(state: Any, owner: str) -> ScaleByAdamAccumulationState:
    """The :class:`ScaleByAdamAccumulationState` in ``state`` (itself, or inside a chain's)."""
    if isinstance(state, ScaleByAdamAccumulationState):
        return state
    found = [x for x in jax.tree_util.tree_leaves(
        state, is_leaf=lambda x: isinstance(x, ScaleByAdamAccumulationState))
        if isinstance(x, ScaleByAdamAccumulationState)]
    if len(found) != 1:
        raise ValueError(f"{owner} needs the state of an adam_accumulation optimizer (one "
                         f"ScaleByAdamAccumulationState inside), got {type(state).__name__} "
                         f"holding {len(found)}.")
    return found[0]


class AccumulatingGradientTransformation(GradientTransformationExtraArgs):
    """A ``GradientTransformation`` that applies one update every few calls, and says when.

    What :func:`adam_accumulation` returns: the usual ``(init, update)`` pair (it fuses
    in a ``chain`` like any other), plus :meth:`has_updated`, the question
    ``MultiSteps.has_updated`` answers.

    Attributes:
      init: ``init(params) -> state``.
      update: ``update(updates, state, params=None, **extra_args) -> (updates, state)``.

    >>> import jax.numpy as jnp
    >>> opt = adam_accumulation(0.1, num_micro_batches=2)
    >>> isinstance(opt, GradientTransformation)
    True
    """

    __slots__ = ()

    def has_updated(self, state: Any) -> Array:
        """True right after the call that applied an optimizer step.

        Args:
          state: the optimizer's state as returned by ``update`` (or ``init``), or the
            :class:`ScaleByAdamAccumulationState` inside it.

        Returns:
          A scalar bool array: ``mini_step == 0`` and ``count > 0``.

        Raises:
          ValueError: ``state`` holds no (or several) ``ScaleByAdamAccumulationState``.

        >>> import jax.numpy as jnp
        >>> opt = adam_accumulation(0.1, num_micro_batches=2)
        >>> params = {'w': jnp.zeros(1)}
        >>> state = opt.init(params)
        >>> _, state = opt.update({'w': jnp.ones(1)}, state, params)
        >>> bool(opt.has_updated(state))
        False
        >>> _, state = opt.update({'w': jnp.ones(1)}, state, params)
        >>> bool(opt.has_updated(state))
        True
        """
        inner = _find_state(state, "has_updated")
        return jnp.logical_and(inner.mini_step == 0, inner.count > 0)


@hyperparameters(num_micro_batches="int", b1="number", b2="decay", eps="number",
                 eps_root="number")
@shared_args()
def scale_by_adam_accumulation(num_micro_batches: int, b1: float = 0.9, b2: float = 0.999,
                               eps: float = 1e-8, eps_root: float = 0.0,
                               mu_dtype: Optional[Any] = None, *,
                               nu_dtype: Optional[Any] = None) -> GradientTransformation:
    """Adam's moments accumulated over ``num_micro_batches`` calls (Zhang et al., 2023).

    Called once per micro-batch with that micro-batch's gradient ``g_i`` (of its mean
    loss). With ``N = num_micro_batches``: at the first micro-batch of optimizer step
    ``t``, ``mu <- b1 mu`` and ``nu <- b2 nu``; at every micro-batch ``mu <- mu + (1-b1)
    g_i / N`` and ``nu <- nu + (1-b2) |g_i|**2 / N``; the ``N``-th call returns Adam's
    direction ``mu_hat / (sqrt(nu_hat + eps_root) + eps)`` (``mu_hat = mu / (1 - b1**t)``,
    ``nu_hat = nu / (1 - b2**t)``), the others return zeros. No gradient buffer is kept.
    Reference: Zhang et al., 2023, "Adam Accumulation to Reduce Memory Footprints of both
    Activations and Gradients for Large-scale DNN Training" (arXiv:2305.19982).

    Args:
      num_micro_batches: ``N``, the micro-batches per optimizer step, an int ``>= 1``
        (1 is :func:`functrain.scale_by_adam`).
      b1: decay rate of the first moment per optimizer step, in ``[0, 1)``.
      b2: decay rate of the second moment per optimizer step, in ``[0, 1)``; or a
        decay-rate schedule of the optimizer step (as ``scale_by_adam``'s).
      eps: added to the denominator outside the square root; ``>= 0``.
      eps_root: added to ``nu_hat`` inside the square root; ``>= 0``.
      <shared: mu_dtype>
      nu_dtype: storage dtype of ``nu``; ``None`` keeps each parameter's dtype.

    Returns:
      A ``GradientTransformation`` whose state is :class:`ScaleByAdamAccumulationState`.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_adam_accumulation(2)
    >>> params = {'w': jnp.array([1., -2.])}
    >>> state = tx.init(params)
    >>> updates, state = tx.update({'w': jnp.array([1., -2.])}, state)
    >>> updates['w']
    Array([0., 0.], dtype=float32)
    >>> updates, state = tx.update({'w': jnp.array([3., -2.])}, state)
    >>> updates['w'].round(4)
    Array([ 0.8944, -1.    ], dtype=float32)
    """
    owner = "scale_by_adam_accumulation"
    n = _checked_micro_batches(owner, num_micro_batches)
    check_betas(owner, b1=b1, b2=b2)
    check_nonnegative(owner, eps=eps, eps_root=eps_root)
    adam_corrections = corrections(b1, b2)

    def init_global() -> dict:
        return {"mini_step": jnp.zeros([], jnp.int32), "count": jnp.zeros([], jnp.int32)}

    def prepare(glob: dict, _: Any) -> tuple:
        step = glob["mini_step"]
        first, emit = step == 0, step == n - 1
        ctx, advanced = adam_corrections({"count": glob["count"]}, None)  # for step t+1
        new_glob = {"mini_step": safe_increment(step) % jnp.asarray(n, step.dtype),
                    "count": jnp.where(emit, advanced["count"], glob["count"])}
        return _Context(emit, jnp.where(first, b1, 1.0), jnp.where(first, ctx.b2, 1.0),
                        (1 - b1) / n, (1 - ctx.b2) / n, ctx), new_glob

    def leaf(g: Array, state: Any, p: Any, ctx: _Context) -> tuple:
        mu = ctx.mu_weight * g + ctx.keep_mu * state.mu
        nu = ctx.nu_weight * abs_sq(g) + ctx.keep_nu * state.nu
        direction = adam_direction(mu, nu, ctx.corrections.mu, ctx.corrections.nu, eps,
                                   eps_root)
        return (jnp.where(ctx.emit, direction, jnp.zeros_like(direction)),
                state._replace(mu=mu, nu=nu))

    return stage_transform(LeafStage(
        name=owner, update_leaf=leaf, state_cls=ScaleByAdamAccumulationState,
        leaf_fields=("mu", "nu"),
        init_leaf=lambda p: (ft.zeros_like(p, mu_dtype), ft.zeros_like(p, nu_dtype)),
        init_global=init_global, prepare=prepare))


def _per_optimizer_step(value: ScalarOrSchedule, n: Any, last_only: bool) -> Any:
    """A schedule of the call count: ``value`` at the optimizer step ``count // n`` (and,
    with ``last_only``, 0 except on the ``n``-th call of each step)."""
    def schedule(count: Array) -> Array:
        now = value_at(value, count // n)
        return jnp.where(count % n == n - 1, now, 0.0) if last_only else now
    return schedule


@declare_optimizer("beyond optax", "Zhang et al., 2023", optax=None, summary=(
    "AdamA (Zhang et al., 2023): gradient accumulation into Adam's moments, one update every "
    "`num_micro_batches` calls with no gradient buffer (`nu` averages the squared "
    "micro-batch gradients)."),
    signature="adam_accumulation(learning_rate, num_micro_batches, b1=0.9, b2=0.999, ...)")
@hyperparameters(learning_rate="schedule", num_micro_batches="int", b1="number", b2="decay",
                 eps="number", eps_root="number", weight_decay="schedule")
@shared_args()
def adam_accumulation(learning_rate: ScalarOrSchedule, num_micro_batches: int,
                      b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                      eps_root: float = 0.0, mu_dtype: Optional[Any] = None,
                      weight_decay: ScalarOrSchedule = 0.0, mask: Optional[MaskOrFn] = None,
                      *, nu_dtype: Optional[Any] = None,
                      cautious_weight_decay: bool = False
                      ) -> AccumulatingGradientTransformation:
    """Adam(W) with its moments accumulated over micro-batches: AdamA (Zhang et al., 2023).

    Call ``update`` once per micro-batch with that micro-batch's gradient ``g_i`` (the
    gradient of its mean loss). With ``N = num_micro_batches`` and optimizer step ``t``
    (counted from 1)::

        first micro-batch of step t:  mu <- b1 mu;  nu <- b2 nu
        every micro-batch i:          mu <- mu + (1-b1) g_i / N;  nu <- nu + (1-b2) |g_i|^2 / N
        after the N-th:               p <- p - lr_t (mu_hat / (sqrt(nu_hat + eps_root) + eps)
                                                     + wd_t p)

    with ``mu_hat = mu / (1 - b1**t)``, ``nu_hat = nu / (1 - b2**t)``, and ``lr_t``,
    ``wd_t`` the (scheduled) learning rate and weight decay at optimizer step ``t - 1``.
    The first ``N - 1`` calls of each step return zero updates (as ``MultiSteps``); the
    ``N``-th returns the step. ``has_updated(state)`` says whether the last call did.

    **Against** ``MultiSteps(adamw(...), N)``: ``mu`` is the same (Adam's first moment of
    the mean gradient ``g = mean_i g_i``), but ``nu`` averages the squared micro-batch
    gradients, ``mean_i |g_i|^2 = |g|^2 + var_i(g_i)``: larger than ``MultiSteps``' ``|g|^2``
    by the variance of the micro-batch gradients (the square of the mean would need the
    buffer of their sum). So the steps are somewhat smaller where the micro-batch
    gradients disagree. Zhang et al. show the same convergence as Adam; Wang & Aitchison
    (2024, "Batch size invariant Adam", arXiv:2402.18824) show that this ``nu`` (its
    expectation is ``E[g]^2 + sigma^2 / micro-batch size``, whatever ``N``) makes Adam
    batch-size invariant when the micro-batch size is held fixed. With ``N = 1`` it is
    ``adamw`` exactly. Prefer it when the gradient buffer's memory matters (the state has
    two parameter-sized trees where ``MultiSteps(adamw)`` has three, and the gradient can
    be freed as soon as it is added); prefer ``MultiSteps`` to reproduce a large-batch
    Adam run exactly, or to accumulate for any other optimizer.

    Works under ``jax.jit`` and in ``jax.lax.scan`` over micro-batches: the update is
    selected with ``jnp.where``, fused into the moments' pass (no Python branch on traced
    values). Measured on 4.2M parameters (``benchmarks/accumulation_memory.py``, the
    donated micro-step's ``memory_analysis()`` on CPU): no temporary, where the same rule
    with ``lax.cond`` keeps a parameter-sized one; peak 67.2 MB against 117.6 MB for
    ``MultiSteps(adamw)``.

    Reference: Zhang et al., 2023, "Adam Accumulation to Reduce Memory Footprints of both
    Activations and Gradients for Large-scale DNN Training" (arXiv:2305.19982).

    Args:
      learning_rate: a number, or a schedule of the optimizer step count (counted from
        0; not of the micro-batch count).
      num_micro_batches: ``N``, micro-batches per optimizer step: an int ``>= 1``.
      b1: decay rate of the first moment per optimizer step, in ``[0, 1)``.
      b2: decay rate of the second moment per optimizer step, in ``[0, 1)``.
      eps: added to ``sqrt(nu_hat)`` in the denominator; ``>= 0``.
      eps_root: added to ``nu_hat`` inside the square root; ``>= 0``.
      <shared: mu_dtype>
      weight_decay: decoupled weight decay as in ``adamw``, ``>= 0`` (default 0: none); a
        number, or a schedule of the optimizer step count.
      mask: which leaves get weight decay (a tree of bools or a function of the params),
        as ``adamw``'s; ``None`` decays every leaf.
      <shared: nu_dtype, cautious_weight_decay>

    Returns:
      An :class:`AccumulatingGradientTransformation` (a ``GradientTransformation`` with
      ``has_updated``): ``chain(scale_by_adam_accumulation, add_decayed_weights,
      scale_by_learning_rate)``. Its state is ``(ScaleByAdamAccumulationState, ...)``: the
      decay (when not a Python 0) and a scheduled learning rate keep a count of calls.

    >>> import jax.numpy as jnp
    >>> from functrain.contrib import adam_accumulation
    >>> opt = adam_accumulation(0.1, num_micro_batches=2)
    >>> params = {'w': jnp.zeros(2)}
    >>> state = opt.init(params)
    >>> u, state = opt.update({'w': jnp.array([1., 2.])}, state, params)
    >>> u['w'], bool(opt.has_updated(state))
    (Array([0., 0.], dtype=float32), False)
    >>> u, state = opt.update({'w': jnp.array([1., -2.])}, state, params)
    >>> u['w'].round(4), bool(opt.has_updated(state))
    (Array([-0.1, -0. ], dtype=float32), True)
    """
    n = _checked_micro_batches("adam_accumulation", num_micro_batches)
    check_range("weight_decay", weight_decay, 0.0, owner="adam_accumulation")
    check_bools("adam_accumulation", cautious_weight_decay=cautious_weight_decay)
    no_decay = not callable(weight_decay) and isinstance(weight_decay, (int, float)) \
        and weight_decay == 0
    decay = identity() if no_decay else add_decayed_weights(
        _per_optimizer_step(weight_decay, n, last_only=True), mask,
        cautious=cautious_weight_decay)
    lr = learning_rate if not callable(learning_rate) else _per_optimizer_step(
        learning_rate, n, last_only=False)
    chained = chain(scale_by_adam_accumulation(n, b1, b2, eps, eps_root, mu_dtype,
                                               nu_dtype=nu_dtype),
                    decay, scale_by_learning_rate(lr))
    return AccumulatingGradientTransformation(chained.init, chained.update)
