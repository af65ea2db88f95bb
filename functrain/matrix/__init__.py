"""Matrix helpers of the matrix optimizers, below the optimizers that use them: ``blocks``
(merging small axes and cutting a leaf into blocks, grouped by shape: the rules Shampoo,
SOAP and Kron share) and ``kron_factors`` (PSGD Kron's batched Kronecker-factor math).
They build on :mod:`functrain.linalg` and :mod:`functrain.numerics`; the optimizers
themselves are in :mod:`functrain.contrib`. The former paths
``functrain.contrib.partition`` and ``functrain.contrib.kron_factors`` still import them."""
