"""Chat, whole and streamed with a usage chunk: python examples/openai_client/chat.py [BASE_URL]."""

from _base import client, served_model

api = client()
model = served_model(api)
messages = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Say hello."}]
answer = api.chat.completions.create(model=model, messages=messages, max_tokens=32, seed=1)
print("answer:", answer.choices[0].message.content)
stream = api.chat.completions.create(
    model=model, messages=messages, max_tokens=32, seed=1, stream=True, stream_options={"include_usage": True}
)
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        print(chunk.choices[0].delta.content, end="", flush=True)
    if chunk.usage:
        print("\nusage:", chunk.usage)
