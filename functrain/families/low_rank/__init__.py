"""Low-rank gradient projections: GaLore (``galore``) and APOLLO (``apollo``: a random
projection's scaled Adam)."""
