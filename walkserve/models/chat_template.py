"""Chat templates (Jinja, from tokenizer_config.json) rendered in a sandbox.

Templates ship with checkpoints and are untrusted code: they are compiled in
``ImmutableSandboxedEnvironment`` (no access to ``__class__`` and friends, no
mutation of the inputs) with the helpers HF templates expect:
``raise_exception``, ``strftime_now``, and a ``tojson`` that keeps non-ASCII.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """One compiled template. ``render`` raises ``jinja2.TemplateError`` (incl. SecurityError) on failure."""

    def __init__(self, source: str):
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        self.source = source
        self._template = env.from_string(source)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **variables: Any) -> str:
        """The prompt text for ``messages``; ``variables`` (bos_token, tools ...) are template globals."""
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt, **variables)
