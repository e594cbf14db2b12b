"""Shared by the openai-client examples: the base URL (argv[1]) and a client for it."""

from __future__ import annotations

import os
import sys

import openai


def base_url() -> str:
    return (sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000").rstrip("/")


def client() -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url()}/v1", api_key=os.environ.get("WALKSERVE_API_KEY", "unused"), max_retries=0)


def served_model(api: openai.OpenAI) -> str:
    return api.models.list().data[0].id
