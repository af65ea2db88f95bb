"""The momentum family: trace, EMA and optimistic-gradient stages (``stages``) and the SGD
and optimistic optimizers (``optimizers``)."""
