"""The former path of :mod:`functrain.matrix.kron_factors` (PSGD Kron's batched factor
math), kept so that ``functrain.contrib.kron_factors.<name>`` still imports: every name here
is the same object as in :mod:`functrain.matrix.kron_factors`. New code should import from
there.

>>> import functrain.matrix.kron_factors
>>> precondition is functrain.matrix.kron_factors.precondition
True
"""

# Re-exports only.
from functrain.matrix.kron_factors import (diagonal_axes, group_noise, precondition,
                                           whitening_step)

__all__ = ["diagonal_axes", "group_noise", "whitening_step", "precondition"]
