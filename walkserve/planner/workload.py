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

Payloads hold media in the HTTP routes' JSON forms, decoded once when the
workload is read: ``{type: array, dtype, shape, data}`` (base64 bytes, as
``POST /v1/generate`` takes them), ``{type: image, url}`` and, in chat
messages, ``{type: image_url, image_url: {url}}``, where ``url`` is a
``data:`` URL or a file path (relative to the workload file).

Each family has a default (``default_workload``; ``family_workloads.py``);
a workload file replaces it. Requests are built by the model's own
processor, so a kind the model cannot take fails here with the processor's
message; only a family default leaves out the kinds a checkpoint cannot take
(V-JEPA 2 without its action-conditioned predictor cannot roll out).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from walkserve.core.array import ArrayData
from walkserve.core.errors import ConfigError, InvalidRequest
from walkserve.core.request import RequestSpec
from walkserve.core.sampling import SamplingParams
from walkserve.planner.simulate import Load

MAX_IMAGE_PIXELS = 4096 * 4096  # an image in a workload file is the user's own: a generous cap


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


def default_workload(family: str, processor: Any = None) -> Workload:
    """The family's default mix (a family without one: text completions of 32 tokens); with the model's
    ``processor``, only the kinds it can take (at least one, else the error names why each failed)."""
    from walkserve.planner.family_workloads import family_default

    workload = family_default(family)
    if processor is None:
        return workload
    kept, why = [], []
    for kind in workload.kinds:
        try:
            Workload((kind,), name=workload.name).specs(processor, 1)
            kept.append(kind)
        except ConfigError as e:
            why.append(str(e))
    if not kept:
        raise ConfigError(f"the {family} default workload does not fit this checkpoint ({'; '.join(why)}); "
                          "give one with --workload FILE")
    return dataclasses.replace(workload, kinds=tuple(kept))


def _kind(entry: Any, i: int, source: str, base: Path) -> RequestKind:
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
    payload = decoded_media(payload, where + ".payload", base)
    return RequestKind(str(entry.get("name", f"kind{i}")), float(weight), entry["task"], payload, tokens,
                       dict(entry.get("params") or {}))


def decoded_media(value: Any, where: str, base: Path) -> Any:
    """``value`` with its arrays and images (the HTTP routes' JSON forms) decoded; the rest as it is."""
    if isinstance(value, list):
        return [decoded_media(v, f"{where}[{i}]", base) for i, v in enumerate(value)]
    if not isinstance(value, dict):
        return value
    kind = value.get("type")
    if kind == "array" and {"dtype", "shape", "data"} <= set(value):
        return _media(where, lambda: decode_array(value))
    if kind == "image" and isinstance(value.get("url"), str):
        return _media(where, lambda: _image(value["url"], base))
    if kind == "image_url" and isinstance(value.get("image_url"), dict) and isinstance(value["image_url"].get("url"), str):
        return {"type": "image", "image": _media(where, lambda: _image(value["image_url"]["url"], base))}
    return {k: decoded_media(v, f"{where}.{k}", base) for k, v in value.items()}


def decode_array(value: dict[str, Any]) -> ArrayData:
    if not isinstance(value["shape"], list) or not all(isinstance(n, int) and n >= 0 for n in value["shape"]):
        raise ValueError("shape must be a list of non-negative integers")
    return ArrayData(str(value["dtype"]), tuple(value["shape"]), base64.b64decode(str(value["data"]), validate=True))


def _image(url: str, base: Path) -> ArrayData:
    from walkserve.api.media.data_url import parse_data_url
    from walkserve.api.media.image_codec import decode_image

    if url.startswith("data:"):
        data = parse_data_url(url, "url")[1]
    else:
        path = base / url.removeprefix("file://")
        try:
            data = path.read_bytes()
        except OSError as e:
            raise ValueError(f"cannot read {path}: {e.strerror}") from None
    return decode_image(data, MAX_IMAGE_PIXELS, "url")


def _media(where: str, decode: Any) -> ArrayData:
    from walkserve.api.errors import ApiError

    try:
        return decode()
    except (ApiError, InvalidRequest, ValueError, binascii.Error) as e:
        raise ConfigError(f"{where}: {getattr(e, 'message', None) or e}") from None


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
    kinds = tuple(_kind(e, i, str(path), path.parent) for i, e in enumerate(data["kinds"]))
    return Workload(kinds, concurrency, path.stem, float(rate) if rate is not None else None)
