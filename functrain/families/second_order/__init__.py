"""Curvature estimates beyond quasi-Newton: Sophia (``sophia``: a diagonal Hessian from
Hutchinson's estimator, clipped steps)."""
