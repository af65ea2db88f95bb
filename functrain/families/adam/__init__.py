"""The Adam family: its moment stages (``stages``) and named optimizers (``optimizers``)."""
