"""Wrappers: transformations that take other transformations.

``masking`` (masked, multi_transform/partition, freeze, selective_transform),
``accumulation`` (MultiSteps), ``finite`` (apply_if_finite, and MultiSteps'
skip_not_finite / skip_large_updates), ``hyperparams`` (inject_hyperparams,
inject_stateful_hyperparams), ``control`` (apply_every, conditionally_*,
flatten), ``monitoring`` (snapshot, monitor, measure_with_ema), ``lookahead``,
``compensated`` (compensated_params: 16-bit weights trained as float32 master weights)
and ``stateless`` (stateless, stateless_with_tree_map, tree_map_params). Each
imports only the engine layer below it.
"""
