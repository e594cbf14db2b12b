"""The workload a placement is planned for: a mix of request kinds with weights, and how many run at once.

    concurrency: 4            # requests in flight (the load the placement must carry: a closed loop)
    rate: 2.5                 # or: requests/s arriving (an open loop, Poisson); replaces concurrency when given
    kinds:
      - name: spoken
        weight: 0.6           # share of the requests (normalised over the kinds)
        task: chat            # the processor's task (speech, chat, completion, generate, ...)
        payload: {messages: [{role: user, content: "Tell me about the sea."}], modalities: [text, audio]}
        max_tokens: 32        # generated tokens (ignore_eos: every request makes exactly this many)
        params: {}            # the model's request parameters

Each family has a default from its card (``default_workload``); a workload
file replaces it. Requests are built by the model's own processor, so a kind
the model cannot take fails here with the processor's message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from walkserve.core.errors import ConfigError
from walkserve.core.request import RequestSpec
from walkserve.core.sampling import SamplingParams
from walkserve.planner.simulate import Load


@dataclass(frozen=True)
class RequestKind:
    name: str
    weight: float
    task: str
    payload: dict[str, Any]
    max_tokens: int = 32
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Workload:
    kinds: tuple[RequestKind, ...]
    concurrency: int = 4
    name: str = "default"
    rate: float | None = None  # requests/s arriving (open loop); None: ``concurrency`` clients (closed loop)

    @property
    def load(self) -> Load:
        return Load(self.concurrency, self.rate)

    def mix(self, n: int) -> list[RequestKind]:
        """``n`` request kinds in the workload's proportions (largest remainder), interleaved."""
        total = sum(k.weight for k in self.kinds)
        counts = [int(n * k.weight / total) for k in self.kinds]
        order = sorted(range(len(self.kinds)), key=lambda i: -(n * self.kinds[i].weight / total - counts[i]))
        for i in order[: n - sum(counts)]:
            counts[i] += 1
        out: list[RequestKind] = []
        while any(counts):
            for i, kind in enumerate(self.kinds):
                if counts[i]:
                    out.append(kind)
                    counts[i] -= 1
        return out

    def specs(self, processor: Any, n: int) -> list[RequestSpec]:
        """``n`` requests of the mix, built by the model's processor (greedy, exactly ``max_tokens`` each)."""
        out = []
        for i, kind in enumerate(self.mix(n)):
            sampling = SamplingParams(temperature=0.0, max_tokens=kind.max_tokens, ignore_eos=True)
            payload = _numbered(kind.payload, i)
            try:
                out.append(processor.build_request(kind.task, payload, sampling, processor.check_params(dict(kind.params))))
            except Exception as e:
                raise ConfigError(f"workload {self.name!r}, kind {kind.name!r}: the model cannot take it: {e}") from None
        return out


def _numbered(payload: Any, i: int) -> Any:
    """The payload with ``{i}`` in its strings replaced by the request's number (distinct prompts)."""
    if isinstance(payload, str):
        return payload.replace("{i}", str(i))
    if isinstance(payload, dict):
        return {k: _numbered(v, i) for k, v in payload.items()}
    if isinstance(payload, list):
        return [_numbered(v, i) for v in payload]
    return payload


def _chat(text: str, audio: bool) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], "modalities": ["text", "audio"] if audio else ["text"]}


DEFAULTS: dict[str, Workload] = {
    "orpheus": Workload((RequestKind("speech", 1.0, "speech", {"input": "Hello number {i}, how are you today?"}, 64),), 4),
    "qwen3-omni": Workload((
        RequestKind("spoken", 0.6, "chat", _chat("Tell me about the number {i} in a few words.", True), 16,
                    {"max_audio_frames": 16}),
        RequestKind("text", 0.4, "chat", _chat("Say something about {i}.", False), 32),
    ), 4),
}


def default_workload(family: str) -> Workload:
    """The family's default mix; a family without one gets a text completion of 32 tokens."""
    found = DEFAULTS.get(family)
    if found is not None:
        return found
    return Workload((RequestKind("text", 1.0, "completion", {"prompt": "Count to {i}:"}, 32),), 4)


def _kind(entry: Any, i: int, source: str) -> RequestKind:
    where = f"{source}: kinds[{i}]"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: must be a mapping with task and payload")
    unknown = set(entry) - {"name", "weight", "rate", "task", "payload", "max_tokens", "params"}
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {sorted(unknown)}")
    weight = entry.get("weight", entry.get("rate", 1.0))
    if not isinstance(weight, (int, float)) or isinstance(weight, bool) or weight <= 0:
        raise ConfigError(f"{where}: weight must be a positive number, got {weight!r}")
    if not isinstance(entry.get("task"), str):
        raise ConfigError(f"{where}: task must name the processor's task (speech, chat, completion, ...)")
    payload = entry.get("payload", {})
    tokens = entry.get("max_tokens", 32)
    if not isinstance(payload, dict) or not isinstance(tokens, int) or tokens < 1:
        raise ConfigError(f"{where}: payload must be a mapping and max_tokens a positive integer")
    return RequestKind(str(entry.get("name", f"kind{i}")), float(weight), entry["task"], payload, tokens,
                       dict(entry.get("params") or {}))


def load_workload(path: str | Path) -> Workload:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ConfigError(f"{path}: cannot read workload file: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("kinds"), list) or not data["kinds"]:
        raise ConfigError(f"{path}: a workload is a mapping with a non-empty list 'kinds'")
    unknown = set(data) - {"kinds", "concurrency", "rate"}
    if unknown:
        raise ConfigError(f"{path}: unknown top-level field(s) {sorted(unknown)}")
    concurrency = data.get("concurrency", 4)
    if not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigError(f"{path}: concurrency must be a positive integer")
    rate = data.get("rate")
    if rate is not None and (not isinstance(rate, (int, float)) or isinstance(rate, bool) or rate <= 0):
        raise ConfigError(f"{path}: rate must be a positive number of requests/s")
    kinds = tuple(_kind(e, i, str(path)) for i, e in enumerate(data["kinds"]))
    return Workload(kinds, concurrency, path.stem, float(rate) if rate is not None else None)
