"""Matrix helpers of the matrix optimizers, below the optimizers that use them: ``blocks``
(merging small axes and cutting a leaf into blocks, grouped by shape: the rules Shampoo,
SOAP and Kron share), ``dimension_numbers`` (which axes of a leaf are stacked layers, and
the leaf as a stack of its layers), ``shape_groups`` (same-shape leaves run as one stack,
their ``group_same_shapes``), ``eigenbases`` (SOAP's rotations, statistics and
their refresh) and ``kron_factors`` (PSGD Kron's batched Kronecker-factor math).
They build on :mod:`functrain.linalg` and :mod:`functrain.numerics`; the optimizers
themselves, with their own steps, are in :mod:`functrain.families.preconditioned` and
:mod:`functrain.families.muon`."""
