"""Wrappers: transformations that take other transformations.

``masking`` (masked, multi_transform/partition, freeze), ``accumulation``
(MultiSteps), ``finite`` (apply_if_finite) and ``hyperparams``
(inject_hyperparams). Each imports only the engine layer below it.
"""
