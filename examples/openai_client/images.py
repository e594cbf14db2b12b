"""Image generation and editing (image models): python examples/openai_client/images.py [BASE_URL] [OUT_DIR]."""

import base64
import io
import sys
from pathlib import Path

from _base import client, served_model
from PIL import Image

api = client()
model = served_model(api)
out = Path(sys.argv[2] if len(sys.argv) > 2 else ".")
result = api.images.generate(model=model, prompt="a lighthouse at dusk", size="64x64", n=1, response_format="b64_json")
(out / "generated.png").write_bytes(base64.b64decode(result.data[0].b64_json))
source = io.BytesIO()
Image.new("RGB", (64, 64), (240, 200, 40)).save(source, format="PNG")
edited = api.images.edit(model=model, image=("in.png", source.getvalue(), "image/png"), prompt="make it night")
(out / "edited.png").write_bytes(base64.b64decode(edited.data[0].b64_json))
print("wrote", out / "generated.png", "and", out / "edited.png")
