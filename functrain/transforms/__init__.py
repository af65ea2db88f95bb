"""Building blocks: the protocol (base), the engine (engine, recompute) and the
per-array stage families (adam, rms, sign, momentum, scaling, layerwise, clipping,
factored, constraints, normalization). Whole-tree transformations (L-BFGS, line searches,
noise) are in :mod:`functrain.whole_tree`."""
