"""Quasi-Newton: L-BFGS (``lbfgs``), the line searches (``linesearch``, and
``value_and_grad_reuse`` for the evaluation they store), whole-tree
transformations run unfused in a ``chain``, and the named ``lbfgs`` optimizer
(``optimizers``)."""
