"""The embedded default model: a tiny random-weight Orpheus, written once into the cache directory.

``walkserve serve`` with no model serves it, so a fresh checkout can answer
every speech route without downloading anything. The weights are random: the
audio is noise, and the model card says ``random_weights``.

The checkpoint is written into a temporary directory beside its final place
and renamed into place in one step, so two servers starting at once never
see a half-written checkpoint; whichever rename comes second keeps the
first one's copy.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from walkserve.core import env
from walkserve.core.errors import ConfigError

EMBEDDED_NAME = "orpheus-tiny-random"  # directory name and served model id
EMBEDDED_SEED = 0
# Default max_tokens of the demo's requests: 24 frames of 7 audio tokens, about 2 s of (noise) audio.
EMBEDDED_MAX_TOKENS = 24 * 7
# Files whose presence marks a complete checkpoint (the rename makes them appear together).
_REQUIRED = ("lm/config.json", "lm/tokenizer.json", "snac/config.json", "snac/model.safetensors")


def embedded_dir(cache_dir: Path | None = None) -> Path:
    """Where the embedded checkpoint lives: ``$WALKSERVE_CACHE_DIR/embedded/orpheus-tiny-random``."""
    root = cache_dir if cache_dir is not None else env.WALKSERVE_CACHE_DIR.get()
    return Path(root) / "embedded" / EMBEDDED_NAME


def is_complete(path: Path) -> bool:
    return all((path / name).is_file() for name in _REQUIRED)


def ensure_embedded(cache_dir: Path | None = None) -> tuple[Path, bool]:
    """(checkpoint directory, whether it was written now); writes it on first use."""
    final = embedded_dir(cache_dir)
    if is_complete(final):
        return final, False
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{EMBEDDED_NAME}-", dir=final.parent))
    except OSError as e:
        raise ConfigError(f"cannot write the embedded model under {final.parent}: {e.strerror} "
                          f"(set WALKSERVE_CACHE_DIR to a writable directory)") from None
    try:
        from walkserve.models.orpheus.tiny import write_tiny_orpheus  # imports torch

        write_tiny_orpheus(tmp, lm="tiny", snac="tiny", seed=EMBEDDED_SEED)
        _move_into_place(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final, True


def _move_into_place(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` to ``final``; a complete copy already there (another start won) is kept."""
    if final.exists() and not is_complete(final):
        # a leftover from an older layout or a crash outside this protocol: replace it
        shutil.rmtree(final, ignore_errors=True)
    try:
        os.rename(tmp, final)
    except OSError:
        if not is_complete(final):
            raise
