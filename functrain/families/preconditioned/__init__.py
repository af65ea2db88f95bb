"""Matrix-preconditioned optimizers: Shampoo (``shampoo``, its per-block math in
``shampoo_blocks``), SOAP (``soap``, its per-leaf math in ``soap_steps``), PSGD Kron
(``kron``, its step's named stages in ``kron_steps``) and SPlus (``splus``). The matrix
helpers they share are :mod:`functrain.matrix`."""
