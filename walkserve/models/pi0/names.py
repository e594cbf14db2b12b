"""lerobot's tensor names of a pi0 / pi0.5 checkpoint and ours (torch-free: the memory check reads them too).

Our names are ``Pi0Policy``'s (``vision.*``, ``lm.*``, ``expert.*``); see ``policy.py`` for the table.
"""

from __future__ import annotations

PALIGEMMA = "paligemma_with_expert.paligemma."
EXPERT = "paligemma_with_expert.gemma_expert."
_RENAMES = (  # own prefix -> checkpoint prefix, first match wins
    ("vision.tower.", PALIGEMMA + "model.vision_tower.vision_model."),
    ("vision.projector.", PALIGEMMA + "model.multi_modal_projector.linear."),
    ("lm.", PALIGEMMA + "model.language_model."),
    ("expert.layers.", EXPERT + "model.layers."),
    ("expert.norm.", EXPERT + "model.norm."),
    ("expert.", ""),
)
TIED_HEAD = PALIGEMMA + "lm_head.weight"
EMBEDDING = PALIGEMMA + "model.language_model.embed_tokens.weight"
UNUSED = (EXPERT + "lm_head.weight", EXPERT + "model.embed_tokens.weight")


def checkpoint_name(own: str) -> str:
    """A Pi0Policy parameter's checkpoint name (``lm.layers.0.mlp.gate_proj.weight`` -> lerobot's)."""
    for mine, theirs in _RENAMES:
        if own.startswith(mine):
            return theirs + own[len(mine):]
    raise KeyError(own)


def component_of(name: str) -> str | None:
    """The serving component that loads checkpoint tensor ``name`` (no ``model.`` prefix): vision, lm, expert,
    or flow_head for the action projections (the expert holds a copy too); None for unused tensors."""
    for own, theirs in _RENAMES[:-1]:
        if name.startswith(theirs):
            return own.split(".")[0]
    if name == TIED_HEAD:
        return "lm"
    if name in UNUSED:
        return None
    return "expert" if name.startswith("time_mlp_") else "flow_head"
