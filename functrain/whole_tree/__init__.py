"""Transformations whose math is not per array: L-BFGS (a history of whole-tree vectors and
their inner products), the line searches (loss evaluations of the whole tree) and additive
noise (one key split over the tree). Each is a plain ``GradientTransformation`` on the same
tree and argument checks as the engine's stages; it runs unfused in a ``chain``."""
