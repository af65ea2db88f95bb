"""Optimizer families, one folder each: the per-array stages of the family
(``stages.py``, plus ``factored.py`` for Adafactor's factored moments) and its named
optimizers (``optimizers.py``, each a short ``chain`` of stages) together.

``adam`` (Adam, AdamW, NAdam, AMSGrad, RAdam, Yogi, AdaBelief, Adamax, LAMB, Adan),
``rms`` (Adagrad, RMSProp, Adadelta, Adafactor, SM3: per-coordinate steps without
momentum), ``sign`` (signSGD, Signum, Lion, Rprop), ``layerwise`` (trust ratios: LARS,
Fromage, NovoGrad), ``momentum`` (trace and EMA; SGD, noisy and Polyak SGD, the optimistic
methods) and ``quasi_newton`` (L-BFGS and the line searches: whole-tree transformations,
not per-array stages). Stages every family uses (scaling, clipping, decay, constraints,
noise) are in :mod:`functrain.transforms`; optimizers optax has only in ``optax.contrib``,
or not at all, are in :mod:`functrain.contrib`.
"""
