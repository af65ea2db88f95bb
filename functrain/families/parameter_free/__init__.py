"""Learning-rate-free and step-size-adapting optimizers: Prodigy, D-Adaptation, DoG and DoWG
(``parameter_free``), COCOB (``coin_betting``), Mechanic (``mechanic``) and MoMo
(``momo``)."""
