"""The layer-wise family: trust-ratio and per-layer norm stages (``stages``) and named
optimizers (``optimizers``)."""
