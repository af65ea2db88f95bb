"""Iterate averaging: Schedule-Free (``schedule_free``), the tail EMA (``tail_ema``) and the
EMA-Nesterov wrapper (``ema_nesterov``), each with its evaluation parameters."""
