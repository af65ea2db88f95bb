"""Stages every optimizer family uses: ``scaling`` (learning rate, schedules, decayed
weights, Polyak), ``clipping``, ``constraints``, ``normalization`` and ``noise``. Each
family's own stages are in :mod:`functrain.families`; the engine is :mod:`functrain.engine`.

As a namespace, ``functrain.transforms`` has the names of ``optax.transforms`` (chaining,
masking and partitioning, accumulation, clipping, EMA and trace, ...), so code written against
optax's ``transforms`` module runs with a changed import:

>>> import jax.numpy as jnp
>>> from functrain import transforms
>>> opt = transforms.partition({'a': transforms.freeze(True), 'b': transforms.trace(0.9)},
...                            {'x': 'a', 'y': 'b'})
>>> updates, _ = opt.update({'x': jnp.ones(2), 'y': jnp.ones(2)},
...                         opt.init({'x': jnp.ones(2), 'y': jnp.ones(2)}))
>>> updates['x'], updates['y']
(Array([0., 0.], dtype=float32), Array([1., 1.], dtype=float32))
"""

# Re-exports only: optax.transforms' names, from where functrain defines them.
from functrain.engine.program import chain, named_chain
from functrain.transforms.accumulation import EmaState, TraceState, ema, trace
from functrain.transforms.clipping import (adaptive_grad_clip, clip, clip_by_block_rms,
                                           clip_by_global_norm, per_example_global_norm_clip,
                                           per_example_layer_norm_clip, unitwise_clip,
                                           unitwise_norm)
from functrain.transforms.constraints import (NonNegativeParamsState, ZeroNansState,
                                              keep_params_nonnegative, zero_nans)
from functrain.transforms.noise import AddNoiseState, add_noise
from functrain.transforms.scaling import add_decayed_weights
from functrain.tree.checks import MaskedNode
from functrain.wrappers.accumulation import MultiSteps, MultiStepsState
from functrain.wrappers.control import (ConditionFn, ConditionallyMaskState,
                                        ConditionallyTransformState, conditionally_mask,
                                        conditionally_transform, flatten)
from functrain.wrappers.finite import (ApplyIfFiniteState, ShouldSkipUpdateFunction,
                                       apply_if_finite, skip_large_updates, skip_not_finite)
from functrain.wrappers.masking import (MaskedState, PartitionState, freeze, masked,
                                        partition, selective_transform)
from functrain.wrappers.monitoring import (MonitorState, SnapshotState, measure_with_ema,
                                           monitor, snapshot)
