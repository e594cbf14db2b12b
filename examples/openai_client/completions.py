"""Text completions, whole and streamed: python examples/openai_client/completions.py [BASE_URL]."""

from _base import client, served_model

api = client()
model = served_model(api)
result = api.completions.create(model=model, prompt="Once upon a time", max_tokens=16, temperature=0)
print("completion:", repr(result.choices[0].text), "| finish:", result.choices[0].finish_reason, "| usage:", result.usage)
print("streamed: ", end="")
for chunk in api.completions.create(model=model, prompt="Once upon a time", max_tokens=16, stream=True):
    print(chunk.choices[0].text, end="", flush=True)
print()
