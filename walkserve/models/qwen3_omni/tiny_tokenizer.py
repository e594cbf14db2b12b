"""A tiny byte-level BPE with Qwen3-Omni's 33 added tokens, for tiny random checkpoints.

Vocabulary: ids 0..255 are the bytes (byte-level alphabet), 256..296 merges
that spell the fillers and the role words, 297..299 ``system`` / ``user`` /
``assistant`` as single tokens (like 8948 / 872 / 77091 in the release), then
the release's added tokens in its order from 300: tiny id = 300 + (release id
- 151643). It loads as ``Qwen2Tokenizer`` in transformers and with
``walkserve.models.tokenizer.Tokenizer``.
"""

from __future__ import annotations

import json
from pathlib import Path

from walkserve.models.common.tiny_tokenizer import qwen_byte_level

ADDED = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
         "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
         "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
         "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>",
         "</tool_response>", "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>",
         "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>")
FIRST_ADDED = 300
TOKEN_IDS = {t: FIRST_ADDED + i for i, t in enumerate(ADDED)}
ROLE_IDS = {"system": 297, "user": 298, "assistant": 299}
_NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>"}

# ChatML with content parts, as the release's template renders messages (tools and
# reasoning branches left out): each media part becomes one placeholder between markers.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'audio' %}{{- '<|audio_start|><|audio_pad|><|audio_end|>' }}"
    "{%- elif part['type'] == 'image' %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'video' %}{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'text' %}{{- part['text'] }}"
    "{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map (printable bytes map to themselves)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    alphabet = byte_alphabet()
    vocab = {alphabet[b]: b for b in range(256)}
    merges, partial = [], []
    for word in ("user", "system", "assistant"):
        piece = word[0]
        for ch in word[1:]:
            merges.append((piece, ch))
            piece += ch
            if piece != word:
                partial.append(piece)
    space = alphabet[ord(" ")]
    fillers = [space + c for c in "abcdefghijklmnopqrstuvwxyzAH"]
    merges += [(space, f[1]) for f in fillers]
    for i, piece in enumerate(partial + fillers):
        vocab[piece] = 256 + i
    vocab.update(ROLE_IDS)
    return vocab, merges


def write_tiny_tokenizer(out_dir: str | Path, model_max_length: int = 4096) -> None:
    """Write tokenizer.json and tokenizer_config.json (with the chat template)."""
    from tokenizers import AddedToken, Tokenizer, models

    out = Path(out_dir)
    vocab, merges = _vocab_and_merges()
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    qwen_byte_level(tok)
    tok.add_tokens([AddedToken(t, special=t not in _NOT_SPECIAL, normalized=False) for t in ADDED])
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "Qwen2Tokenizer", "backend": "tokenizers", "add_prefix_space": False, "bos_token": None,
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None, "errors": "replace",
        "clean_up_tokenization_spaces": False, "split_special_tokens": False, "model_max_length": model_max_length,
        "image_token": "<|image_pad|>", "audio_token": "<|audio_pad|>", "video_token": "<|video_pad|>",
        "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>",
        "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>",
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
