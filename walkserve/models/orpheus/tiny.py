"""A random-weight Orpheus checkpoint in the official layouts, for tests, benchmarks and the embedded demo.

``write_tiny_orpheus(out_dir, lm="tiny" | "bench", snac="tiny" | "full", seed=0)`` writes

    out_dir/lm/     a Llama checkpoint with Orpheus's vocabulary layout: vocab 156,940, tied
                    embeddings, llama3 rope (theta 500k, factor 32), bos 128000, eos 128009,
                    pad 128004; audio ids at their real positions (128266 + position * 4096 + code).
                    Its tokenizer covers text (a small byte-level BPE, ids < 1000) plus the
                    special tokens at their real ids (<|begin_of_text|> = 128000, <custom_token_N>
                    = 128256 + N for the Orpheus markers). config.json is marked
                    ``"walkserve_random_weights": true``.
    out_dir/snac/   a SNAC 24 kHz checkpoint (``models.snac.tiny.write_snac``).

The ``tiny`` LM (~10M parameters, almost all embedding) keeps tests fast; the
``bench`` LM (~33M) has Orpheus's proportions (heads x head_dim = hidden, GQA
3:1, MLP 2.67x hidden) at hidden 192 with 6 layers. The weights are random:
the speech is noise, and the card says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from walkserve.core.errors import ConfigError
from walkserve.models.common.tiny_tokenizer import CORPUS
from walkserve.models.llama.tiny import write_tiny
from walkserve.models.orpheus.tokens import CUSTOM_TOKEN_BASE, START_OF_TEXT
from walkserve.models.snac.tiny import write_snac

VOCAB_SIZE = 156940
BOS, EOS, PAD, END_OF_TEXT_ID = START_OF_TEXT, 128009, 128004, 128001
TEXT_VOCAB = 1000  # the trained BPE's size: every text id stays below it
N_MARKERS = 10  # <custom_token_0..9>: the Orpheus markers (128257 start of speech ... 128263 pad) and spares
ORPHEUS_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
_COMMON = {"vocab_size": VOCAB_SIZE, "tie_word_embeddings": True, "rms_norm_eps": 1e-5, "rope": ORPHEUS_ROPE,
           "rope_theta": 500000.0, "max_position_embeddings": 8192}
LM_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {**_COMMON, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16},
    "bench": {**_COMMON, "hidden_size": 192, "intermediate_size": 512, "num_hidden_layers": 6,
              "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 32},
    "gpu": {**_COMMON, "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8,
            "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64},  # the GPU benchmark's
}
SNAC_PRESETS = ("tiny", "full")
SPECIAL_TOKENS = {
    BOS: "<|begin_of_text|>",
    END_OF_TEXT_ID: "<|end_of_text|>",
    PAD: "<|finetune_right_pad_id|>",
    EOS: "<|eot_id|>",
    **{CUSTOM_TOKEN_BASE + n: f"<custom_token_{n}>" for n in range(N_MARKERS)},
}


def write_tiny_orpheus(out_dir: str | Path, lm: str = "tiny", snac: str = "tiny", seed: int = 0) -> Path:
    """Write ``out_dir/lm`` and ``out_dir/snac``; returns ``out_dir`` (serve it with family ``orpheus``)."""
    if lm not in LM_PRESETS:
        raise ConfigError(f"unknown Orpheus LM preset {lm!r} (known: {', '.join(LM_PRESETS)})")
    if snac not in SNAC_PRESETS:
        raise ConfigError(f"unknown SNAC preset {snac!r} (known: {', '.join(SNAC_PRESETS)})")
    out = Path(out_dir)
    lm_dir = write_tiny("llama", out / "lm", seed=seed, **LM_PRESETS[lm])
    write_orpheus_tokenizer(lm_dir, LM_PRESETS[lm]["max_position_embeddings"])
    _patch_json(lm_dir / "config.json", bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
    _patch_json(lm_dir / "generation_config.json", bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
    write_snac(out / "snac", snac, seed=seed + 1)
    return out


def write_orpheus_tokenizer(lm_dir: Path, model_max_length: int) -> None:
    """tokenizer.json + tokenizer_config.json: a small text BPE, special tokens at Orpheus's real ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TEXT_VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS.splitlines(), trainer)
    data = json.loads(tok.to_str())
    # the library numbers added tokens after the model's vocabulary unless the vocabulary already holds them
    data["model"]["vocab"].update({text: i for i, text in SPECIAL_TOKENS.items()})
    data["added_tokens"] = [_added(i, text) for i, text in sorted(SPECIAL_TOKENS.items())]
    data["post_processor"] = _bos_template()
    (lm_dir / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIAL_TOKENS[BOS],
        "eos_token": SPECIAL_TOKENS[EOS],
        "pad_token": SPECIAL_TOKENS[PAD],
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {str(i): _added(i, text) for i, text in SPECIAL_TOKENS.items()},
    }
    (lm_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def _added(token_id: int, text: str) -> dict[str, Any]:
    return {"id": token_id, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


def _bos_template() -> dict[str, Any]:
    """Llama-3's post-processor: ``<|begin_of_text|>`` before every sequence."""
    bos = SPECIAL_TOKENS[BOS]
    piece = {"SpecialToken": {"id": bos, "type_id": 0}}
    return {
        "type": "TemplateProcessing",
        "single": [piece, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [piece, {"Sequence": {"id": "A", "type_id": 0}}, piece, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos: {"id": bos, "ids": [BOS], "tokens": [bos]}},
    }


def _patch_json(path: Path, **values: Any) -> None:
    data = json.loads(path.read_text())
    data.update(values)
    path.write_text(json.dumps(data, indent=2))
