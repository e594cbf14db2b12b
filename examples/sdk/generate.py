"""The native NDJSON route through walkserve.client: python examples/sdk/generate.py [BASE_URL]."""

import sys

from walkserve.client import Client

base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
with Client(base) as client:
    print("health:", client.health())
    text = []
    for event in client.generate({"prompt": "Hello"}, modalities=["text"], sampling={"max_tokens": 16}):
        if event["type"] == "output" and event["modality"] == "text":
            text.append(event["data"]["text"] or "")
        elif event["type"] == "finished":
            print("text:", "".join(text) + event["text"], "| finish:", event["finish_reason"], "| usage:", event["usage"])
