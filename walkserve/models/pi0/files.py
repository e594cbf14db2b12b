"""The torch-free files of a pi0 / pi0.5 checkpoint: config.json, the tokenizer, the normalisation statistics.

The tokenizer is not part of lerobot's release: PaliGemma's SentencePiece
model is given by path (``--tokenizer-path``), or found as ``tokenizer.model``
in the checkpoint directory (tiny checkpoints ship one).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from walkserve.core.errors import ConfigError
from walkserve.models.pi0.config import PolicyConfig
from walkserve.models.pi0.normalizer import Normalizer
from walkserve.models.pi0.spm_tokenizer import SentencePieceTokenizer

TOKENIZER_FILE = "tokenizer.model"


@dataclass(frozen=True)
class PolicyFiles:
    """What serving one checkpoint needs besides the weights: config, tokenizer, normaliser."""

    config: PolicyConfig
    tokenizer: SentencePieceTokenizer
    normalizer: Normalizer


def load_policy_files(path: str | Path, tokenizer_path: str | Path | None = None) -> PolicyFiles:
    """Torch-free: config.json, the processors' statistics and the SentencePiece tokenizer."""
    path = Path(path)
    config = PolicyConfig.from_file(path)
    tok = Path(tokenizer_path) if tokenizer_path is not None else path / TOKENIZER_FILE
    if not tok.is_file():
        raise ConfigError(f"no tokenizer: {tok} does not exist (lerobot's checkpoints ship none: pass "
                          f"--tokenizer-path with PaliGemma's SentencePiece model, paligemma_tokenizer.model)")
    tokenizer = SentencePieceTokenizer.from_file(tok)
    if tokenizer.vocab_size > config.vocab_size:
        raise ConfigError(f"{tok}: {tokenizer.vocab_size} pieces, more than the model's vocabulary {config.vocab_size}")
    return PolicyFiles(config, tokenizer, Normalizer.from_dir(path, config.state_dim, config.action_dim))
