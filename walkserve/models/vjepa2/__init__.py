"""V-JEPA 2 (video features, masked prediction) and V-JEPA 2-AC (action-conditioned rollouts, CEM planning).

Components: ``encoder.VisionEncoder`` (stateless, behind ``encoder_component``),
``masked_predictor.MaskedPredictor``, ``ac_predictor.ACPredictor`` (a KV-cache
component; token layout in ``step_tokens``). Offline loops: ``rollout`` and
``cem``. Loading: ``weights``, ``convert`` (the released AC ``.pt``), ``tiny``.
Request checks, torch-free: ``validate``.
"""
