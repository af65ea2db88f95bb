"""functrain: a JAX-native functional optimizer library with optax's API and numbers.

>>> import jax, jax.numpy as jnp, functrain
>>> opt = functrain.chain(functrain.clip_by_global_norm(1.0), functrain.lamb(1e-3))
>>> params = {'w': jnp.ones(3)}
>>> state = opt.init(params)
>>> grads = jax.grad(lambda p: jnp.sum(p['w'] ** 2))(params)
>>> updates, state = opt.update(grads, state, params)
>>> params = functrain.apply_updates(params, updates)
"""

from functrain import tree
# Protocol, combinators and helpers.
from functrain.transforms.base import (EmptyState, GradientTransformation, LeafStage,
                                       apply_updates, chain, global_norm, identity,
                                       safe_increment, stage_transform)
from functrain.tree import MaskedNode
# Building blocks.
from functrain.transforms.moments import (ScaleByAdamState, ScaleByLionState,
                                          ScaleByRmsState, ScaleByRmsWithCountState,
                                          ScaleByRssState, ScaleByRStdDevState,
                                          ScaleByRStdDevWithCountState, scale_by_adam,
                                          scale_by_lion, scale_by_rms, scale_by_rss,
                                          scale_by_stddev)
from functrain.transforms.scaling import (ScaleByScheduleState, TraceState,
                                          add_decayed_weights, clip, clip_by_global_norm,
                                          scale, scale_by_learning_rate, scale_by_schedule,
                                          scale_by_trust_ratio, trace)
# Learning-rate schedules.
from functrain.schedules import (Schedule, constant_schedule, cosine_decay_schedule,
                                 exponential_decay, join_schedules, linear_schedule,
                                 piecewise_constant_schedule, polynomial_schedule,
                                 warmup_constant_schedule, warmup_cosine_decay_schedule)
# Optimizers.
from functrain.transforms.optimizers import (adagrad, adam, adamw, lamb, lars, lion,
                                             rmsprop, sgd)

__version__ = "0.1.0"

# --- seed gradient API (issue 3) ---
# `functrain.grad` is the module functrain/grad.py, which is callable as the
# gradient function: functrain.grad(f)(x).  See functrain/grad.py.
from functrain import grad
from functrain.grad import execute_with_gradients, jac, stop_gradient, value_and_grad
from functrain.seed_updates import (adam_step, adam_update, gradient_descent_update,
                                    lamb_update, lars_update, optimizer_update)

# --- wrappers and more optimizers (issue 4) ---
from functrain.transforms.wrappers import (MaskedState, MultiTransformState, PartitionState,
                                           SetToZeroState, freeze, masked, multi_transform,
                                           named_chain, partition, set_to_zero)
from functrain.transforms.control import (ApplyIfFiniteState, HyperparamsDict,
                                          InjectHyperparamsState,
                                          MultiSteps, MultiStepsState, apply_if_finite,
                                          inject_hyperparams)
from functrain.transforms.leafwise import (AddNoiseState, EmaState, NonNegativeParamsState,
                                           ZeroNansState, add_noise, ema,
                                           keep_params_nonnegative, zero_nans)
from functrain.transforms.more import (ScaleByAdaDeltaState, ScaleByOptimisticGradientState,
                                       ScaleByRpropState, ScaleBySM3State, adadelta, fromage,
                                       noisy_sgd, optimistic_gradient_descent, polyak_sgd,
                                       rprop, scale_by_adadelta, scale_by_optimistic_gradient,
                                       scale_by_polyak, scale_by_rprop, scale_by_sign,
                                       scale_by_sm3, sign_sgd, signum, sm3)
from functrain.transforms.adaptive import (ScaleByAmsgradState, ScaleByBeliefState,
                                           ScaleByNovogradState, adabelief, adamax, adamaxw,
                                           amsgrad, nadam, nadamw, novograd, radam,
                                           scale_by_adamax, scale_by_amsgrad, scale_by_belief,
                                           scale_by_novograd, scale_by_radam, scale_by_yogi,
                                           yogi)
from functrain.transforms.adafactor import (FactoredState, adafactor, clip_by_block_rms,
                                            scale_by_factored_rms, scale_by_param_block_norm,
                                            scale_by_param_block_rms)

# --- sharding (issue 6) ---
from functrain import sharding

# --- opt-in grouped engine (issue 5) ---
from functrain.transforms.grouped import GroupedState, grouped
