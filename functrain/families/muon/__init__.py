"""The Muon family: orthogonalized updates. ``muon`` is the family's base (batched
Newton-Schulz and Polar Express over the tree, the split into Muon and AdamW leaves; the
dimension numbers are in :mod:`functrain.matrix.dimension_numbers`);
the others build on it: ``normuon``, ``adamuon``, ``muon_clip`` (with QK-Clip), ``scion``,
``hyperball`` (MuonH and AdamH, and the fixed-radius step ``radius_pin`` shares),
``radius_pin``, ``dion`` (low-rank orthonormal updates) and ``soap_muon``."""
