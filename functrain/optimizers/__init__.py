"""The named optimizers of optax's core, each a short ``chain`` of building blocks.

One module per kind of optimizer, named for what it holds: ``adam_family`` (Adam and its
variants: AdamW, NAdam, AMSGrad, RAdam, Yogi, AdaBelief, Adamax, LAMB, Adan), ``rms_family``
(per-coordinate adaptive steps without momentum: Adagrad, RMSProp, Adadelta, Adafactor, SM3),
``sgd`` (SGD, noisy and Polyak SGD), ``sign_based`` (signSGD, Signum, Lion, Rprop),
``layerwise`` (LARS, Fromage, NovoGrad), ``optimistic`` (optimistic gradient descent and
Adam) and ``quasi_newton`` (L-BFGS). Each is assembled only from public building blocks of
:mod:`functrain.transforms`; optimizers optax lacks live in :mod:`functrain.contrib`.
"""
