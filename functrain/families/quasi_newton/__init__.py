"""Quasi-Newton: L-BFGS (``lbfgs``), the line searches (``linesearch``), whole-tree
transformations run unfused in a ``chain``, and the named ``lbfgs`` optimizer
(``optimizers``)."""
