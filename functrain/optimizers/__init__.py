"""The named optimizers, each a short ``chain`` of building blocks.

One rule for all of them: every named optimizer lives in this package, in the
file of its family (``adam_family``, ``sgd_family``, ``rms_family``), and is
assembled only from public building blocks of :mod:`functrain.transforms`.
"""
