"""Registers the model families that ship with walkserve (imports nothing heavy)."""

from walkserve.models.registry import register

register("llama", "walkserve.models.llama.model:build")
register("qwen2", "walkserve.models.llama.model:build")
register("qwen3", "walkserve.models.llama.model:build")
register("orpheus", "walkserve.models.orpheus.model:build")
register("qwen3-omni", "walkserve.models.qwen3_omni.model:build")
register("pi0", "walkserve.models.pi0.model:build")
register("pi05", "walkserve.models.pi0.model:build")
register("bagel", "walkserve.models.bagel.model:build")
register("vjepa2", "walkserve.models.vjepa2.model:build")
# Other families (the fixture models of walkserve.testing among them) come from the "walkserve.models"
# entry points (pyproject.toml), read by the registry.
