"""A small byte-level BPE tokenizer with chat special tokens, trained on a built-in corpus.

Used by the tiny checkpoint writers (Llama, Orpheus, BAGEL) so that tiny random checkpoints come with a real
``tokenizer.json`` / ``tokenizer_config.json`` pair in the HF layout. Training
is deterministic: the same vocabulary size gives the same file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from walkserve.core.errors import ConfigError

CORPUS = """\
The river ran quietly past the old mill, where the miller kept his accounts in a small green book.
Every morning he counted the sacks of flour, wrote the numbers down, and walked to the village to
sell bread. The children waited for him at the bridge, because he always carried a few sweet rolls.

A language model reads a sequence of tokens and predicts the next one. It learns which words tend to
follow which, how sentences are built, and how a question is usually answered. Serving such a model
means running it for many users at once: requests arrive, their prompts are processed, and new tokens
are generated one step at a time until each answer is complete.

Weather report: clear skies in the morning, light rain in the afternoon, and a cool wind from the
north after sunset. Temperatures will stay between nine and fifteen degrees. Tomorrow will be warmer,
with sunshine over the hills and a calm evening near the coast.

She opened the letter, read the first line twice, and smiled. "You were right about the garden," it
said. "The roses came back, the apple tree is full of fruit, and the cat still sleeps on the warm
stones by the door." She folded the page and put it in her pocket.

Numbers and symbols appear too: 1, 2, 3, 10, 42, 100, 2048; prices like $5.99 or 20%; times such as
09:30 and 17:45; and questions like "What is the capital of France?" or "How many days are in a week?"
Some text is not English: 你好，世界。 日本語のテキスト。 Здравствуйте! Ça va très bien, merci. 🙂 🚀 ✨
"""

# (special tokens in id order, bos, eos tokens of config.json, eos token of tokenizer_config.json, pad)
_STYLES: dict[str, tuple[tuple[str, ...], str | None, tuple[str, ...], str, str]] = {
    "llama3": (
        ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        "<|begin_of_text|>",
        ("<|end_of_text|>", "<|eot_id|>"),
        "<|eot_id|>",
        "<|end_of_text|>",
    ),
    "chatml": (
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        None,
        ("<|im_end|>", "<|endoftext|>"),
        "<|im_end|>",
        "<|endoftext|>",
    ),
    "bagel": (  # Qwen2.5's ChatML tokens plus the image block markers BAGEL places
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>"),
        None,
        ("<|im_end|>", "<|endoftext|>"),
        "<|im_end|>",
        "<|endoftext|>",
    ),
}

QWEN_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_ROLE_CHECK = (
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}{% endif %}"
)
CHAT_TEMPLATES = {
    "llama3": (
        "{{ bos_token }}{% for message in messages %}" + _ROLE_CHECK
        + "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
        " + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
    ),
    "chatml": (
        "{% for message in messages %}" + _ROLE_CHECK
        + "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    ),
}
CHAT_TEMPLATES["bagel"] = CHAT_TEMPLATES["chatml"]


def qwen_byte_level(tok: Any) -> None:
    """Qwen's byte-level layout on a ``tokenizers.Tokenizer``: NFC, its split regex, then bytes, and the byte-level
    decoder (what transformers' Qwen2Tokenizer rebuilds from the files)."""
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers

    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()


@dataclass(frozen=True)
class TinyTokenIds:
    """The special ids a config.json / generation_config.json must agree with."""

    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int


def write_tokenizer(out_dir: Path, style: str, vocab_size: int, model_max_length: int) -> TinyTokenIds:
    """Train and write tokenizer.json + tokenizer_config.json; every id stays below ``vocab_size``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials, bos, eos, eos_config, pad = _STYLES[style]
    base = vocab_size - len(specials)
    if base < 256 + 8:
        raise ConfigError(f"a tiny byte-level tokenizer needs vocab_size >= {256 + 8 + len(specials)}, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    if style in ("chatml", "bagel"):
        qwen_byte_level(tok)
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=base, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(CORPUS.splitlines(), trainer)
    tok.add_special_tokens(list(specials))
    ids = {t: tok.token_to_id(t) for t in specials}
    if bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, ids[bos])]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.save(str(out_dir / "tokenizer.json"))
    config = _tokenizer_config(ids, bos, eos_config, pad, CHAT_TEMPLATES[style], model_max_length)
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    return TinyTokenIds(None if bos is None else ids[bos], tuple(ids[t] for t in eos), ids[pad])


def _tokenizer_config(ids: dict[str, int], bos: str | None, eos: str, pad: str, template: str,
                      model_max_length: int) -> dict:
    added = {
        str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                 "special": True}
        for t, i in ids.items()
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": pad,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": added,
        "chat_template": template,
    }
