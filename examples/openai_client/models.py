"""List the served model and what it can do: python examples/openai_client/models.py [BASE_URL]."""

from _base import client

api = client()
for model in api.models.list().data:
    extra = model.model_extra or {}
    print(model.id, "capabilities:", ", ".join(extra.get("capabilities", [])))
    print("  random weights:", extra.get("random_weights"), "| voices:", extra.get("voices"), "| audio formats:", extra.get("audio_formats"))
