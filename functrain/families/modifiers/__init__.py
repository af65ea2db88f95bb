"""What changes any optimizer: the cautious mask, MARS's correction, trust-region clipping
and PaLM's decay schedule (``modifiers``), complex parameters as real pairs
(``complex_valued``), update normalization (``normalize``), differential privacy
(``privacy``), sharpness-aware minimization (``sam``) and the learning rate cut on a
plateau (``reduce_on_plateau``)."""
