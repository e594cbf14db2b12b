"""The frontend's half of the family (config, tokenizer, prompts, normalisation, validation) imports no torch."""

from __future__ import annotations

import subprocess
import sys

TORCH_FREE = ["config", "files", "inputs", "normalizer", "observations", "prompt", "request", "spm_model",
              "spm_tokenizer", "tiny_tokenizer"]


def test_frontend_modules_do_not_import_torch():
    imports = "; ".join(f"import walkserve.models.pi0.{m}" for m in TORCH_FREE)
    code = f"import sys; {imports}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
