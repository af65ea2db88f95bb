"""The RMS family: per-coordinate second-moment stages (``stages``), Adafactor's factored
moments (``factored``) and the named optimizers (``optimizers``)."""
