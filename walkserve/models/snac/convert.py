"""One-time conversion of a released SNAC checkpoint (``pytorch_model.bin``) to ``model.safetensors``.

    python -m walkserve.models.snac.convert SRC_DIR DST_DIR

Reads ``SRC_DIR/pytorch_model.bin`` once with ``torch.load(weights_only=True)``
(no arbitrary unpickling), checks that every tensor the decoder needs is
present and well shaped, and writes ``DST_DIR/model.safetensors`` with every
tensor under its original name (weight-norm ``g``/``v`` pairs kept as they are,
encoder included, so the ``snac`` package can still load the result) plus a
copy of ``config.json``. ``DST_DIR`` may equal ``SRC_DIR``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from walkserve.core.errors import ConfigError
from walkserve.models.snac.config import SnacConfig
from walkserve.models.snac.weights import CONFIG_FILE, PICKLE_FILE, WEIGHTS_FILE, decoder_state_dict


def _read_pickle(file: Path) -> dict[str, torch.Tensor]:
    if not file.is_file():
        raise ConfigError(f"SNAC conversion: {file} does not exist")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # the unpickler raises many types; all mean "not a plain state dict"
        raise ConfigError(
            f"SNAC conversion: cannot read {file} as a weights-only state dict: {e}"
        ) from None
    if not isinstance(state, dict):
        raise ConfigError(
            f"SNAC conversion: {file} holds a {type(state).__name__}, not a state dict"
        )
    bad = sorted(
        str(k)
        for k, v in state.items()
        if not isinstance(k, str) or not isinstance(v, torch.Tensor)
    )
    if bad:
        raise ConfigError(f"SNAC conversion: {file} has non-tensor entries {bad[:8]}")
    return state


def convert_snac(src_dir: str | Path, dst_dir: str | Path) -> Path:
    """Convert ``src_dir`` (config.json + pytorch_model.bin) to ``dst_dir`` (config.json + model.safetensors).

    Returns the safetensors path. Raises ConfigError naming a missing file,
    an unreadable pickle, or missing / mis-shaped decoder tensors.
    """
    src, dst = Path(src_dir), Path(dst_dir)
    cfg = SnacConfig.from_file(src / CONFIG_FILE)
    state = _read_pickle(src / PICKLE_FILE)
    decoder_state_dict(cfg, state)  # validates names and shapes before anything is written
    dst.mkdir(parents=True, exist_ok=True)
    out = dst / WEIGHTS_FILE
    tensors = {name: t.detach().contiguous().clone() for name, t in state.items()}
    save_file(tensors, str(out), metadata={"format": "pt", "source": PICKLE_FILE})
    if (dst / CONFIG_FILE).resolve() != (src / CONFIG_FILE).resolve():
        shutil.copyfile(src / CONFIG_FILE, dst / CONFIG_FILE)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m walkserve.models.snac.convert", description=__doc__.splitlines()[0]
    )
    parser.add_argument("src_dir", help="directory with config.json and pytorch_model.bin")
    parser.add_argument("dst_dir", help="directory to write config.json and model.safetensors into")
    args = parser.parse_args(argv)
    try:
        out = convert_snac(args.src_dir, args.dst_dir)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
