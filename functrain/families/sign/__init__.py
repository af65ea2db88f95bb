"""The sign family: sign and Lion/Rprop stages (``stages``) and named optimizers
(``optimizers``)."""
