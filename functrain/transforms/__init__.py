"""Gradient transformations: the protocol, building blocks and optimizers."""
