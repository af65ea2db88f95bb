"""The engine: what every transformation is and how it runs, one concept per module.

``protocol`` (optax's ``GradientTransformation`` and its ExtraArgs variant), ``stage``
(``LeafStage``: the per-array math of one transformation, with its input checks
``LeafChecks``), ``program`` (``Program``, the one definition of a transformation's
``update``: ``run_block``, ``chain``, ``stage_transform``), ``state_io`` (``StateIO``: how
per-leaf state is read and written, and its identity ``PLAIN_STATE``), ``counts`` (step
counts and bias corrections, what a stage's ``prepare`` computes), ``dtypes`` (the dtype
each leaf's math, state and update take) and ``recompute`` (the CPU-only rewrite of a block
for very large leaves, off elsewhere). The per-array math lives in
:mod:`functrain.families` and :mod:`functrain.transforms`.
"""
