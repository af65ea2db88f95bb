"""The engine: what every transformation is and how it runs.

``protocol`` (``GradientTransformation`` and its ExtraArgs variant, ``LeafStage``, the
``StateIO`` protocol and its identity ``PLAIN_STATE``), ``program`` (``Program``, the one
definition of a transformation's ``update``; ``run_block``, ``chain``, ``stage_transform``)
``dtypes`` (the dtype each leaf's math, state and update take) and ``recompute`` (the
CPU-only rewrite of a block for very large leaves, off elsewhere).
The per-array math lives in :mod:`functrain.families` and :mod:`functrain.transforms`.
"""
