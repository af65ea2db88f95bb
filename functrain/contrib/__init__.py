"""functrain.contrib: every optimizer of ``optax.contrib`` under optax's names, and the
matrix and adaptive optimizers optax does not have (``shampoo``, ``soap``, ``splus``, ``kron``,
``dion``, ``came``, ``mars``, ``laprop``, ``normuon``, ``adamuon``, ``adam_mini``, ``apollo``,
``apollo_mini``, ``adam_accumulation``, ``muonh``, ``adamh``, ``muon_clip``, ``scion``,
``spam``, ``stable_spam``, ``soap_muon``), modifiers for any optimizer (``cautious``,
``cautious_adamw``, ``cautious_lion``, ``mars_correction``, ``trust_region_clip``, ``tail_ema``,
``ema_nesterov``), and Cautious Weight Decay, the ``cautious_weight_decay=`` option of every
decoupled-decay optimizer.

Switching is a changed import: ``optax.contrib.muon`` is ``functrain.contrib.muon``,
with the same arguments, defaults and numbers (tested step by step against
optax.contrib). The five most used are also at functrain's top level: ``muon``,
``schedule_free_adamw``, ``prodigy``, ``adopt`` and ``ademamix``.

This package is a face: no code lives here. Each optimizer is defined in its algorithm's
family under :mod:`functrain.families` (``adam``, ``rms``, ``muon``, ``low_rank``,
``preconditioned``, ``parameter_free``, ``averaging``, ``modifiers``, ``second_order``), and
its ``@declare_optimizer`` says whether optax has it; this module re-exports every
optimizer declared ``optax="contrib"`` or ``optax=None`` with its stages and state classes
(``tests/test_declarations.py`` checks the two agree).

>>> import jax.numpy as jnp, functrain
>>> opt = functrain.contrib.adopt(1e-3)
>>> state = opt.init({'w': jnp.ones(3)})
"""

# Re-exports only. optax.contrib's optimizers:
from functrain.families.adam.acprop import acprop, scale_by_acprop
from functrain.families.adam.ademamix import (ScaleByAdemamixState, ScaleBySimplifiedAdEMAMixState,
                                              ademamix, scale_by_ademamix,
                                              scale_by_simplified_ademamix, simplified_ademamix)
from functrain.families.parameter_free.coin_betting import COCOBState, cocob, scale_by_cocob
from functrain.families.modifiers.complex_valued import (SplitRealAndImaginaryState,
                                                         split_real_and_imaginary)
from functrain.families.adam.adopt import adopt, scale_by_adopt
from functrain.families.low_rank.galore import (GaLoreDimensionNumbers, GaLoreState, galore,
                                                scale_by_galore)
from functrain.families.rms.madgrad import MadgradState, madgrad, scale_by_madgrad
from functrain.families.parameter_free.mechanic import MechanicState, mechanize
from functrain.families.parameter_free.momo import MomoAdamState, MomoState, momo, momo_adam
from functrain.families.muon.muon import MuonState, muon, scale_by_muon
from functrain.matrix.dimension_numbers import MuonDimensionNumbers
from functrain.families.modifiers.normalize import NormalizeState, normalize
from functrain.families.parameter_free.parameter_free import (DAdaptAdamWState, DoGState, DoWGState,
                                                              ProdigyState, dadapt_adamw, dog, dowg,
                                                              prodigy)
from functrain.families.modifiers.privacy import (DifferentiallyPrivateAggregateState,
                                                  differentially_private_aggregate, dpsgd)
from functrain.families.modifiers.reduce_on_plateau import ReduceLROnPlateauState, reduce_on_plateau
from functrain.families.modifiers.sam import SAMState, sam
from functrain.families.averaging.schedule_free import (ScheduleFreeState, schedule_free,
                                                        schedule_free_adamw,
                                                        schedule_free_eval_params,
                                                        schedule_free_sgd)
from functrain.families.second_order.sophia import (HutchinsonState, SophiaState,
                                                    hutchinson_estimator_diag_hessian, sophia)

# Beyond optax (one optimizer per module):
from functrain.families.adam.adam_accumulation import (AccumulatingGradientTransformation,
                                                       ScaleByAdamAccumulationState,
                                                       adam_accumulation,
                                                       scale_by_adam_accumulation)
from functrain.families.adam.adam_mini import (ScaleByAdamMiniState, adam_mini, adam_mini_blocks,
                                               adam_mini_decay_mask, scale_by_adam_mini)
from functrain.families.muon.adamuon import AdaMuonState, adamuon, scale_by_adamuon
from functrain.families.low_rank.apollo import ApolloState, apollo, apollo_mini, scale_by_apollo
from functrain.families.rms.came import CameState, came, scale_by_came
from functrain.families.muon.hyperball import (ScaleByHyperballState, adamh, hyperball_step, muonh,
                                               scale_by_hyperball)
from functrain.families.muon.dion import ScaleByDionState, dion, scale_by_dion
from functrain.families.averaging.ema_nesterov import (EmaNesterovState, ema_nesterov,
                                                       ema_nesterov_eval_params)
from functrain.families.preconditioned.kron import (KronState, kron, precond_update_prob_schedule,
                                                    scale_by_kron)
from functrain.families.adam.laprop import ScaleByLapropState, laprop, scale_by_laprop
from functrain.families.adam.mars import MarsState, mars, scale_by_mars
from functrain.families.muon.muon_clip import QKClipLayer, muon_clip, qk_clip
from functrain.families.muon.normuon import NorMuonState, normuon, scale_by_normuon
from functrain.families.muon.radius_pin import (ScaleByRadiusPinState, radius_pin_step,
                                                scale_by_radius_pin)
from functrain.families.modifiers.modifiers import (DecaySchedule, MarsCorrectionState, cautious,
                                                    cautious_adamw, cautious_lion, mars_correction,
                                                    palm_beta2_schedule, trust_region_clip)
from functrain.families.muon.scion import ScaleByScionState, scale_by_scion, scion, scion_direction
from functrain.families.preconditioned.shampoo import ShampooState, scale_by_shampoo, shampoo
from functrain.families.preconditioned.soap import SoapState, scale_by_soap, soap
from functrain.families.muon.soap_muon import SoapMuonState, scale_by_soap_muon, soap_muon
from functrain.families.adam.spam import (ScaleBySpamState, ScaleByStableSpamState, scale_by_spam,
                                          scale_by_stable_spam, spam, stable_spam)
from functrain.families.preconditioned.splus import (SplusState, scale_by_splus, splus,
                                                     splus_get_eval_params)
from functrain.families.averaging.tail_ema import TailEmaState, tail_ema, tail_ema_eval_params
