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

Each module here holds one family: its per-array stages (run by functrain's
engine, like every other transform) and its named optimizers. A contrib module
may import functrain's lower layers (tree, numerics, the modules beside the stack such
as linalg and schedules, the matrix helpers of :mod:`functrain.matrix`, transforms,
wrappers and optimizers), but not another contrib module. ``partition`` and
``kron_factors`` here are the former paths of :mod:`functrain.matrix`'s ``blocks`` and
``kron_factors`` (re-exports only).

>>> import jax.numpy as jnp, functrain
>>> opt = functrain.contrib.adopt(1e-3)
>>> state = opt.init({'w': jnp.ones(3)})
"""

# Re-exports only. optax.contrib's optimizers, one family per module:
from functrain.contrib.acprop import acprop, scale_by_acprop
from functrain.contrib.ademamix import (ScaleByAdemamixState, ScaleBySimplifiedAdEMAMixState,
                                        ademamix, scale_by_ademamix,
                                        scale_by_simplified_ademamix, simplified_ademamix)
from functrain.contrib.coin_betting import COCOBState, cocob, scale_by_cocob
from functrain.contrib.complex_valued import (SplitRealAndImaginaryState,
                                              split_real_and_imaginary)
from functrain.contrib.adopt import adopt, scale_by_adopt
from functrain.contrib.galore import (GaLoreDimensionNumbers, GaLoreState, galore,
                                      scale_by_galore)
from functrain.contrib.madgrad import MadgradState, madgrad, scale_by_madgrad
from functrain.contrib.mechanic import MechanicState, mechanize
from functrain.contrib.momo import MomoAdamState, MomoState, momo, momo_adam
from functrain.contrib.muon import MuonDimensionNumbers, MuonState, muon, scale_by_muon
from functrain.contrib.normalize import NormalizeState, normalize
from functrain.contrib.parameter_free import (DAdaptAdamWState, DoGState, DoWGState,
                                              ProdigyState, dadapt_adamw, dog, dowg, prodigy)
from functrain.contrib.privacy import (DifferentiallyPrivateAggregateState,
                                       differentially_private_aggregate, dpsgd)
from functrain.contrib.reduce_on_plateau import ReduceLROnPlateauState, reduce_on_plateau
from functrain.contrib.sam import SAMState, sam
from functrain.contrib.schedule_free import (ScheduleFreeState, schedule_free,
                                             schedule_free_adamw, schedule_free_eval_params,
                                             schedule_free_sgd)
from functrain.contrib.sophia import (HutchinsonState, SophiaState,
                                      hutchinson_estimator_diag_hessian, sophia)

# Beyond optax (one optimizer per module):
from functrain.contrib.adam_accumulation import (AccumulatingGradientTransformation,
                                                 ScaleByAdamAccumulationState,
                                                 adam_accumulation, scale_by_adam_accumulation)
from functrain.contrib.adam_mini import (ScaleByAdamMiniState, adam_mini, adam_mini_blocks,
                                         adam_mini_decay_mask, scale_by_adam_mini)
from functrain.contrib.adamuon import AdaMuonState, adamuon, scale_by_adamuon
from functrain.contrib.apollo import ApolloState, apollo, apollo_mini, scale_by_apollo
from functrain.contrib.came import CameState, came, scale_by_came
from functrain.contrib.hyperball import (ScaleByHyperballState, adamh, hyperball_step,
                                         muonh, scale_by_hyperball)
from functrain.contrib.dion import ScaleByDionState, dion, scale_by_dion
from functrain.contrib.ema_nesterov import (EmaNesterovState, ema_nesterov,
                                            ema_nesterov_eval_params)
from functrain.contrib.kron import KronState, kron, precond_update_prob_schedule, scale_by_kron
from functrain.contrib.laprop import ScaleByLapropState, laprop, scale_by_laprop
from functrain.contrib.mars import MarsState, mars, scale_by_mars
from functrain.contrib.muon_clip import QKClipLayer, muon_clip, qk_clip
from functrain.contrib.normuon import NorMuonState, normuon, scale_by_normuon
from functrain.contrib.radius_pin import (ScaleByRadiusPinState, radius_pin_step,
                                          scale_by_radius_pin)
from functrain.contrib.modifiers import (DecaySchedule, MarsCorrectionState, cautious,
                                         cautious_adamw, cautious_lion, mars_correction,
                                         palm_beta2_schedule, trust_region_clip)
from functrain.contrib.scion import (ScaleByScionState, scale_by_scion, scion,
                                    scion_direction)
from functrain.contrib.shampoo import ShampooState, scale_by_shampoo, shampoo
from functrain.contrib.soap import SoapState, scale_by_soap, soap
from functrain.contrib.soap_muon import SoapMuonState, scale_by_soap_muon, soap_muon
from functrain.contrib.spam import (ScaleBySpamState, ScaleByStableSpamState, scale_by_spam,
                                    scale_by_stable_spam, spam, stable_spam)
from functrain.contrib.splus import SplusState, scale_by_splus, splus, splus_get_eval_params
from functrain.contrib.tail_ema import TailEmaState, tail_ema, tail_ema_eval_params
