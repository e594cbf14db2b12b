"""Chat about an image sent as a data: URL: python examples/openai_client/chat_image.py [BASE_URL]."""

import base64
import io

from _base import client, served_model
from PIL import Image

buffer = io.BytesIO()
Image.new("RGB", (32, 32), (30, 144, 255)).save(buffer, format="PNG")
url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
api = client()
answer = api.chat.completions.create(
    model=served_model(api),
    messages=[{"role": "user", "content": [{"type": "text", "text": "Describe this."}, {"type": "image_url", "image_url": {"url": url}}]}],
    max_tokens=32,
)
print(answer.choices[0].message.content)
