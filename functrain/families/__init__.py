"""The optimizers, by algorithm: one folder per family, each holding its per-array stages
(``stages.py``), its named optimizers and the helpers only it uses. Where optax has an
optimizer decides only its public name (``functrain.<name>`` for optax's core,
``functrain.contrib.<name>`` otherwise, from its ``@declare_optimizer``), not its folder.

In the order they may build on each other (a family imports only from those before it;
``tests/test_architecture.py``):

``momentum`` (optimistic gradients; SGD, noisy and Polyak SGD), ``adam`` (Adam, AdamW,
NAdam, AMSGrad, RAdam, Yogi, AdaBelief, Adamax, Adan, optimistic Adam, and the variants
optax lacks or has in contrib: ADOPT, AdEMAMix, ACProp, LaProp, MARS, SPAM, Adam-mini,
AdamA), ``layerwise`` (trust ratios: LARS, LAMB, Fromage, NovoGrad), ``rms``
(per-coordinate steps without momentum: Adagrad, RMSProp, Adadelta, Adafactor, SM3, CAME,
MADGRAD), ``sign`` (signSGD, Signum, Lion, Rprop), ``quasi_newton`` (L-BFGS and the line
searches: whole-tree transformations), ``second_order`` (Sophia), ``parameter_free``
(Prodigy, D-Adaptation, DoG, DoWG, COCOB, Mechanic, MoMo), ``averaging`` (Schedule-Free,
the tail EMA, EMA-Nesterov), ``modifiers`` (cautious masks, MARS's correction, privacy,
SAM, normalization, complex parameters, the plateau cut), ``muon`` (Muon and what builds
on it: NorMuon, AdaMuon, MuonClip, Scion, MuonH/AdamH, Dion, SOAP-Muon), ``low_rank``
(GaLore, APOLLO) and ``preconditioned`` (Shampoo, SOAP, Kron, SPlus).

Stages every family uses (scaling, clipping, accumulation, decay, constraints, noise) are
in :mod:`functrain.transforms`; :mod:`functrain.contrib` and :mod:`functrain.transforms`
(as a namespace) are faces over these folders.
"""

#: The families in the order they may build on each other: a module of one imports from
#: another family only if that one comes earlier (tests/test_architecture.py); the README's
#: table of optax.contrib's optimizers lists them in this order (docs/generate_tables.py).
ORDER = ("momentum", "adam", "layerwise", "rms", "sign", "quasi_newton", "second_order",
         "parameter_free", "averaging", "modifiers", "muon", "low_rank", "preconditioned")
