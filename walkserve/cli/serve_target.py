"""ServeTarget: which model ``walkserve serve`` starts, from MODEL, --model-path and --snac-path.

    (no MODEL, no --model-path)   the embedded tiny random-weight Orpheus (cli/embedded.py)
    MODEL = auto, or only a path  the family read from the checkpoint (config.json architecture or model_type;
                                  a directory with lm/ and snac/, or --snac-path: orpheus; ema.safetensors
                                  with llm_config.json: bagel)
    MODEL = orpheus|llama|qwen2|qwen3|qwen3-omni|bagel|pi0|pi05|vjepa2 (or any registered family)

pi0 / pi0.5 checkpoints are recognised by config.json's ``"type"``; their
tokenizer is PaliGemma's SentencePiece model, given with --tokenizer-path.
V-JEPA 2 by its ``model_type`` (``vjepa2``: HF; ``vjepa2-ac``: converted by walkserve convert vjepa2-ac).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from walkserve.core.errors import ConfigError
from walkserve.models.base import ModelRef
from walkserve.models.orpheus.tokens import AUDIO_TOKEN_RANGE

SERVED_FAMILIES = ("orpheus", "llama", "qwen2", "qwen3", "qwen3-omni", "bagel", "pi0", "pi05", "vjepa2")
POLICY_FAMILIES = ("pi0", "pi05")  # lerobot's config.json "type"
VJEPA2_MODEL_TYPES = ("vjepa2", "vjepa2-ac")  # HF V-JEPA 2; our converted V-JEPA 2-AC
# Orpheus's audio codes end here: a Llama vocabulary at least this large is an Orpheus LM
ORPHEUS_MIN_VOCAB = AUDIO_TOKEN_RANGE[1]


@dataclass(frozen=True)
class ServeTarget:
    """A model to start: its family, checkpoint directory and options, and how it was chosen."""

    family: str
    path: str | None
    options: dict[str, Any] = field(default_factory=dict)
    embedded: bool = False
    detected: bool = False  # the family was read from the checkpoint (MODEL auto)

    def ref(self) -> ModelRef:
        return ModelRef(self.family, self.path, dict(self.options))


def resolve_target(model: str | None, model_path: str | None, snac_path: str | None,
                   model_id: str | None = None, cache_dir: Path | None = None,
                   tokenizer_path: str | None = None) -> ServeTarget:
    """The model ``walkserve serve`` should start; ConfigError (one line) for anything inconsistent."""
    options: dict[str, Any] = {"model_id": model_id} if model_id else {}
    if model is None and model_path is None:
        if snac_path is not None:
            raise ConfigError("--snac-path needs the Orpheus LM too: walkserve serve orpheus --model-path LM_DIR --snac-path SNAC_DIR")
        return _embedded(options, cache_dir)
    if model_path is not None:
        _check_dir(model_path, "--model-path")
    if snac_path is not None:
        _check_dir(snac_path, "--snac-path")
    detected = model in (None, "auto")
    family = detect_family(model_path, snac_path) if detected else model
    _check_family(family, model_path, snac_path)
    if tokenizer_path is not None:
        options["tokenizer_path"] = _tokenizer_file(tokenizer_path, family)
    if snac_path is not None:
        options["snac_path"] = str(Path(snac_path).resolve())
    path = str(Path(model_path).resolve()) if model_path is not None else None
    return ServeTarget(family, path, options, detected=detected)


def _embedded(options: dict[str, Any], cache_dir: Path | None) -> ServeTarget:
    from walkserve.cli.embedded import EMBEDDED_NAME, embedded_dir

    options = {"model_id": EMBEDDED_NAME, **options}
    return ServeTarget("orpheus", str(embedded_dir(cache_dir)), options, embedded=True)


def detect_family(model_path: str | None, snac_path: str | None) -> str:
    """MODEL ``auto``: the family a checkpoint directory holds."""
    if model_path is None:
        raise ConfigError("MODEL auto reads the family from the checkpoint: give --model-path DIR")
    root = Path(model_path)
    if snac_path is not None or ((root / "lm").is_dir() and (root / "snac").is_dir()):
        return "orpheus"
    if not (root / "config.json").is_file():
        raise ConfigError(f"{root}: no config.json, so the model family is unknown; name it (walkserve serve FAMILY ...)")
    if _is_qwen3_omni(root / "config.json"):
        return "qwen3-omni"
    policy = _policy_type(root)
    if policy is not None:
        return policy
    if _model_type(root / "config.json") in VJEPA2_MODEL_TYPES:
        return "vjepa2"
    from walkserve.models.bagel.model import is_bagel_dir

    if is_bagel_dir(root):  # BAGEL's config.json holds no architecture; its layout says what it is
        return "bagel"
    from walkserve.models.common.lm_config import LMConfig

    config = LMConfig.from_file(root)
    if config.vocab_size >= ORPHEUS_MIN_VOCAB:
        raise ConfigError(f"{root} looks like an Orpheus LM (audio codes in its vocabulary); serve it with: "
                          f"walkserve serve orpheus --model-path {root} --snac-path SNAC_DIR")
    return config.family


def _model_type(config_file: Path) -> str | None:
    import json

    try:
        data = json.loads(config_file.read_text())
    except (OSError, ValueError):
        return None  # LMConfig reports what is wrong with the file
    return data.get("model_type") if isinstance(data, dict) else None


def _is_qwen3_omni(config_file: Path) -> bool:
    import json

    from walkserve.models.qwen3_omni.config import is_qwen3_omni

    try:
        data = json.loads(config_file.read_text())
    except (OSError, ValueError):
        return False  # LMConfig reports what is wrong with the file
    return isinstance(data, dict) and is_qwen3_omni(data)


def _check_family(family: str, model_path: str | None, snac_path: str | None) -> None:
    import walkserve.models.builtin  # noqa: F401  (registers the shipped families)
    from walkserve.models.registry import families

    known = families()
    if family not in known and ":" not in family:
        raise ConfigError(f"unknown model family {family!r} (choose one of: auto, {', '.join(SERVED_FAMILIES)})")
    if snac_path is not None and family != "orpheus":
        raise ConfigError(f"--snac-path is an Orpheus option; model family {family!r} takes none")
    if family in SERVED_FAMILIES and model_path is None:
        raise ConfigError(f"model family {family!r} needs its checkpoint: --model-path DIR")
    if family == "orpheus":
        _check_orpheus(Path(model_path), snac_path)


def _check_orpheus(root: Path, snac_path: str | None) -> None:
    """The Orpheus LM is found, has Orpheus's audio vocabulary, and a SNAC directory is known."""
    embedded = (root / "lm").is_dir() and (root / "snac").is_dir()
    if snac_path is None and not embedded:
        raise ConfigError(f"{root}: Orpheus needs its SNAC codec too: add --snac-path SNAC_DIR "
                          "(or give a directory holding lm/ and snac/)")
    lm = root / "lm" if embedded else root
    if not (lm / "config.json").is_file():
        raise ConfigError(f"{lm}: not an Orpheus LM directory (no config.json)")
    from walkserve.models.common.lm_config import LMConfig

    vocab = LMConfig.from_file(lm).vocab_size
    if vocab < ORPHEUS_MIN_VOCAB:
        raise ConfigError(f"{lm}: not an Orpheus LM: its vocabulary ({vocab} ids) has no audio codes "
                          f"(Orpheus's end at id {ORPHEUS_MIN_VOCAB - 1})")


def _policy_type(root: Path) -> str | None:
    """``pi0`` / ``pi05`` for a lerobot policy checkpoint (config.json ``"type"``), else None."""
    import json

    try:
        kind = json.loads((root / "config.json").read_text()).get("type")
    except (OSError, ValueError, AttributeError):
        return None
    return kind if kind in POLICY_FAMILIES else None


def _tokenizer_file(path: str, family: str) -> str:
    if family not in POLICY_FAMILIES:
        raise ConfigError(f"--tokenizer-path is a pi0 / pi0.5 option (PaliGemma's SentencePiece model); "
                          f"model family {family!r} reads its tokenizer from its checkpoint")
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--tokenizer-path {path}: no such file (PaliGemma's paligemma_tokenizer.model)")
    return str(p.resolve())


def _check_dir(path: str, flag: str) -> None:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{flag} {path}: no such directory")
    if not p.is_dir():
        raise ConfigError(f"{flag} {path}: not a directory")
