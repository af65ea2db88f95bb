"""functrain: a JAX-native functional optimizer library with optax's API and numbers.

>>> import jax, jax.numpy as jnp, functrain
>>> opt = functrain.chain(functrain.clip_by_global_norm(1.0), functrain.lamb(1e-3))
>>> params = {'w': jnp.ones(3)}
>>> state = opt.init(params)
>>> grads = jax.grad(lambda p: jnp.sum(p['w'] ** 2))(params)
>>> updates, state = opt.update(grads, state, params)
>>> params = functrain.apply_updates(params, updates)
"""

# Re-exports only: the public surface, grouped as users look for it. Each module is named once.

# --- the protocol, chaining and applying updates ---
from functrain.param_updates import (apply_updates, apply_updates_stochastic, incremental_update,
                                     periodic_update)
from functrain.engine.protocol import (EmptyState, GradientTransformation,
                                       GradientTransformationExtraArgs, MaskOrFn, OptState, Params,
                                       ScalarOrSchedule, TransformInitFn,
                                       TransformUpdateExtraArgsFn, TransformUpdateFn, Updates,
                                       with_extra_args_support)
from functrain.engine.stage import LeafChecks, LeafStage
from functrain.engine.counts import safe_increment
from functrain.engine.program import chain, identity, named_chain, stage_transform

# --- named optimizers (optax's core; optax.contrib's are in functrain.contrib) ---
from functrain.families.adam.optimizers import (adabelief, adam, adamax, adamaxw, adamw, adan,
                                                amsgrad, nadam, nadamw, radam, yogi)
from functrain.families.adam.optimistic import optimistic_adam, optimistic_adam_v2
from functrain.families.layerwise.optimizers import fromage, lamb, lars, novograd
from functrain.families.momentum.optimizers import optimistic_gradient_descent
from functrain.families.quasi_newton.optimizers import lbfgs
from functrain.families.rms.optimizers import adadelta, adafactor, adagrad, rmsprop, sm3
from functrain.families.momentum.optimizers import noisy_sgd, polyak_sgd, sgd
from functrain.families.sign.optimizers import lion, rprop, sign_sgd, signum
# optax.contrib's five most used, also at the top level:
from functrain.contrib import ademamix, adopt, muon, prodigy, schedule_free_adamw

# --- building blocks: per-array stages ---
from functrain.families.adam.stages import (ScaleByAdamState, ScaleByAdanState, ScaleByAmsgradState,
                                            ScaleByBeliefState, scale_by_adam, scale_by_adamax,
                                            scale_by_adan, scale_by_amsgrad, scale_by_belief,
                                            scale_by_radam, scale_by_yogi)
from functrain.transforms.clipping import (AdaptiveGradClipState, ClipByGlobalNormState,
                                           ClipState, adaptive_grad_clip, clip,
                                           clip_by_block_rms, clip_by_global_norm,
                                           per_example_global_norm_clip,
                                           per_example_layer_norm_clip, unitwise_clip,
                                           unitwise_norm)
from functrain.transforms.constraints import (NonNegativeParamsState, ZeroNansState,
                                              keep_params_nonnegative, zero_nans)
from functrain.families.rms.factored import FactoredState, scale_by_factored_rms
from functrain.families.layerwise.stages import (ScaleByDistanceOverGradientsState,
                                                 ScaleByNovogradState, ScaleByTrustRatioState,
                                                 scale_by_distance_over_gradients,
                                                 scale_by_novograd, scale_by_param_block_norm,
                                                 scale_by_param_block_rms, scale_by_trust_ratio)
from functrain.families.momentum.stages import (ScaleByOptimisticGradientState,
                                                scale_by_optimistic_gradient)
from functrain.transforms.accumulation import EmaState, TraceState, ema, trace
from functrain.transforms.normalization import (centralize, normalize_by_update_norm,
                                                scale_gradient)
from functrain.families.rms.stages import (ScaleByAdaDeltaState, ScaleByRmsState,
                                           ScaleByRmsWithCountState, ScaleByRssState,
                                           ScaleByRStdDevState, ScaleByRStdDevWithCountState,
                                           ScaleBySM3State, scale_by_adadelta, scale_by_rms,
                                           scale_by_rss, scale_by_sm3, scale_by_stddev)
from functrain.transforms.scaling import (AddDecayedWeightsState, ScaleByScheduleState,
                                          ScaleState, SetToZeroState, add_decayed_weights,
                                          scale, scale_by_learning_rate, scale_by_polyak,
                                          scale_by_schedule, set_to_zero)
from functrain.families.sign.stages import (ScaleByLionState, ScaleByRpropState, scale_by_lion,
                                            scale_by_rprop, scale_by_sign)

# --- whole-tree transforms: noise, quasi-Newton, line searches ---
from functrain.families.quasi_newton.lbfgs import ScaleByLBFGSState, scale_by_lbfgs
from functrain.families.quasi_newton.linesearch import (ScaleByBacktrackingLinesearchState,
                                                        ScaleByZoomLinesearchState,
                                                        ZoomLinesearchInfo,
                                                        scale_by_backtracking_linesearch,
                                                        scale_by_zoom_linesearch)
from functrain.families.quasi_newton.value_and_grad_reuse import value_and_grad_from_state
from functrain.transforms.noise import AddNoiseState, add_noise

# --- wrappers: masking, accumulation, skipping, hyperparameters, control, monitoring ---
from functrain.wrappers.accumulation import MultiSteps, MultiStepsState
from functrain.wrappers.control import (ApplyEvery, ConditionFn, ConditionallyMaskState,
                                        ConditionallyTransformState, apply_every,
                                        conditionally_mask, conditionally_transform, flatten)
from functrain.wrappers.finite import (ApplyIfFiniteState, ShouldSkipUpdateFunction,
                                       apply_if_finite, skip_large_updates, skip_not_finite)
from functrain.wrappers.hyperparams import (HyperparamsDict, InjectHyperparamsState,
                                            InjectStatefulHyperparamsState, StatefulSchedule,
                                            WrappedSchedule, WrappedScheduleState,
                                            inject_hyperparams, inject_stateful_hyperparams)
from functrain.hyperparams_reader import current_hyperparams
from functrain.wrappers.compensated import (CompensatedParamsState, compensated_master,
                                            compensated_params)
from functrain.gradient_release import (GradientRelease, GradientReleaseState,
                                        gradient_release)
from functrain.flat_layout import FlatLayout, flat_layout, on_flat_layout
from functrain.wrappers.lookahead import LookaheadParams, LookaheadState, lookahead
from functrain.wrappers.masking import (MaskedState, MultiTransformState, PartitionState,
                                        freeze, masked, multi_transform, partition,
                                        selective_transform)
from functrain.wrappers.monitoring import (MeasureEmaState, MonitorState, SnapshotState,
                                           measure_with_ema, monitor, snapshot)
from functrain.wrappers.stateless import (init_empty_state, stateless,
                                          stateless_with_tree_map, tree_map_params)
from functrain.quantized_state import (QuantizedArray, adam_8bit, adamw_4bit,
                                       adamw_8bit, adamw_fp8, quantized_state)

# --- learning-rate schedules ---
from functrain.schedules import (Schedule, constant_schedule, cosine_decay_schedule,
                                 cosine_onecycle_schedule, exponential_decay, join_schedules,
                                 linear_onecycle_schedule, linear_schedule,
                                 piecewise_constant_schedule, piecewise_interpolate_schedule,
                                 polynomial_schedule, sgdr_schedule, warmup_constant_schedule,
                                 warmup_cosine_decay_schedule, warmup_exponential_decay_schedule)

# --- losses: the ones optax has at its top level (all of optax.losses' in functrain.losses) ---
from functrain.losses import (convex_kl_divergence, cosine_distance, cosine_similarity, ctc_loss,
                              ctc_loss_with_forward_probs, generalized_kl_divergence,
                              hinge_loss, huber_loss, kl_divergence, l2_loss, log_cosh, ntxent,
                              safe_softmax_cross_entropy, sigmoid_binary_cross_entropy,
                              sigmoid_focal_loss, smooth_labels, softmax_cross_entropy,
                              softmax_cross_entropy_with_integer_labels, squared_error)

# --- trees, numerics and linear algebra ---
from functrain import (contrib, linalg, losses, microbatching, numerics, projections, sharding,
                       tree, tree_utils)
from functrain.linalg import global_norm, matrix_inverse_pth_root, power_iteration
from functrain.microbatching import microbatch
from functrain.numerics import safe_int32_increment, safe_norm, safe_root_mean_squares
from functrain.tree import (MaskedNode, bias_correction, update_infinity_moment, update_moment,
                            update_moment_per_elem_norm)

# --- Ivy's gradient functions and one-shot updates (the seed documents) ---
# `functrain.grad` is the function, imported over the submodule's name.
from functrain.grad import execute_with_gradients, grad, jac, stop_gradient, value_and_grad
from functrain.compat import (adam_step, adam_update, gradient_descent_update, lamb_update,
                              lars_update, optimizer_update)

# optax's public modules that functrain leaves to optax: what each is, and where to get it.
_LEFT_TO_OPTAX = {
    "assignment": "the Hungarian algorithm (hungarian_algorithm, base_assignment)",
    "perturbations": "perturbed smoothing of functions (make_perturbed_fun)",
    "second_order": "Hessian and Fisher diagonals (deprecated in optax: use jax.jvp/vjp)",
    "experimental": "optax's experimental aggregating API",
    "multi_normal": "a Gaussian log-density helper",
    "nnls": "a non-negative least-squares solver",
}


def __getattr__(name: str):
    """A clear ``AttributeError`` for optax's modules that functrain leaves to optax."""
    if name in _LEFT_TO_OPTAX:
        raise AttributeError(
            f"module 'functrain' has no attribute {name!r}: optax.{name} ({_LEFT_TO_OPTAX[name]}) "
            f"is not an optimizer and is left to optax: install optax and use optax.{name} "
            f"itself (optax composes with functrain).")
    raise AttributeError(f"module 'functrain' has no attribute {name!r}")


__version__ = "0.2.0"  # the one copy: pyproject.toml reads it; CHANGELOG.md
