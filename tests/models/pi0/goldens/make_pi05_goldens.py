"""Regenerate ``pi05_goldens.safetensors`` / ``pi05_goldens.json`` from lerobot's pi0.5 (not run by CI).

pi0.5 has no reference in this project's environment: lerobot 0.6.1 is its
PyTorch port (openpi's PI0Pytorch, line by line), but it needs torch < 2.12,
transformers < 5.6 and Python >= 3.12. It runs on this project's torch 2.13
CPU build in a separate Python 3.11 venv with three local workarounds, all in
this file: a rewrite of the five lerobot files that use 3.12-only syntax, an
import-only torchvision stand-in (inference never calls torchvision), and
patches for tiny sizes (lerobot hard-codes gemma_2b / gemma_300m, the So400m
MLP, a 2048-wide projector and the 257,152-token vocabulary).

How the goldens were made (two processes, one command):

    python3.11 -m venv /tmp/pi05_oracle
    /tmp/pi05_oracle/bin/pip install torch==2.13.0 "transformers==5.5.4" "huggingface-hub>=1.6,<2" \\
        "numpy<2.3" "einops<0.9" "draccus==0.11.6" safetensors "packaging<26" termcolor tqdm requests \\
        "pillow<13" scipy "gymnasium>=1.1.1,<2" "opencv-python-headless>=4.9,<4.14" sentencepiece
    /tmp/pi05_oracle/bin/pip install --no-deps --ignore-requires-python lerobot==0.6.1
    .venv/bin/python tests/models/pi0/goldens/make_pi05_goldens.py --oracle-python /tmp/pi05_oracle/bin/python

1. This project's venv writes the tiny checkpoint ``write_tiny_policy("pi05", seed=0)``
   (config, weights, processor statistics, tokenizer) to a temporary directory.
2. The oracle venv re-runs this file with ``--oracle``: it builds lerobot's
   ``PI05Policy`` at the tiny sizes, loads the checkpoint's ``model.safetensors``
   with ``load_state_dict(strict=True)``, normalises the state with lerobot's
   ``NormalizerProcessorStep`` (from the checkpoint's processor files), builds the
   prompt with ``Pi05PrepareStateTokenizerProcessorStep``, tokenises it with the
   ``sentencepiece`` library, prepares the images with ``_preprocess_images``
   (resize with padding, [-1, 1], the absent camera masked), runs
   ``model.sample_actions`` with explicit noise (recording each step's velocity and
   the prefix K/V) and unnormalises with ``UnnormalizerProcessorStep``.
3. It writes the inputs, those intermediate tensors and the outputs next to this
   file, with a hash of the checkpoint's tensors so the test notices if the tiny
   writer changed (then rerun this script).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN_TENSORS = HERE / "pi05_goldens.safetensors"
GOLDEN_META = HERE / "pi05_goldens.json"
SEED = 0

# Two requests on the same tiny checkpoint (3 cameras configured, state 8, actions 7, horizon 10).
CASES = [
    {"name": "two_cameras", "prompt": " Pick_up the red cube\nnow ",
     "state": [0.3, -1.9, 1.2, 0.0, -0.7, 1.9, 2.5, -3.0],
     "cameras": {"base_0_rgb": [30, 40], "left_wrist_0_rgb": [28, 28]}, "noise_seed": 11, "image_seed": 5},
    {"name": "three_cameras", "prompt": "put the black bowl on the plate",
     "state": [1.0, 0.5, -0.5, -1.0, 0.25, -0.25, 0.75, 0.1],
     "cameras": {"base_0_rgb": [28, 28], "left_wrist_0_rgb": [56, 28], "right_wrist_0_rgb": [20, 24]},
     "noise_seed": 12, "image_seed": 6},
]


def tensor_hash(path: Path) -> str:
    """sha256 over the sorted tensor names and their raw bytes (independent of the file's layout)."""
    from safetensors.numpy import load_file

    tensors = load_file(str(path))
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].tobytes())
    return h.hexdigest()


def case_inputs(case: dict):
    """The uint8 camera images [H, W, 3] and the noise [H, 32] of a case (numpy, seeded)."""
    import numpy as np

    rng = np.random.default_rng(case["image_seed"])
    images = {cam: rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8) for cam, (h, w) in case["cameras"].items()}
    noise = np.random.default_rng(case["noise_seed"]).standard_normal((10, 32)).astype(np.float32)
    return images, noise


# --- the project side ---------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--oracle-python", help="python of the lerobot venv")
    parser.add_argument("--oracle", metavar="CHECKPOINT", help="(internal) run the lerobot half on CHECKPOINT")
    args = parser.parse_args()
    if args.oracle:
        run_oracle(Path(args.oracle))
        return
    if not args.oracle_python:
        parser.error("--oracle-python is required")
    sys.path.insert(0, str(HERE.parents[3]))
    from walkserve.models.pi0.tiny import write_tiny_policy

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_tiny_policy("pi05", Path(tmp) / "pi05", seed=SEED)
        subprocess.run([args.oracle_python, __file__, "--oracle", str(ckpt)], check=True)
    print(f"wrote {GOLDEN_TENSORS} and {GOLDEN_META}")


# --- the oracle side (lerobot's venv) -----------------------------------------------------------


def run_oracle(ckpt: Path) -> None:
    import os

    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch

    torch.set_num_threads(1)
    _rewrite_py312_syntax()
    _stub_torchvision()
    policy, config = _tiny_lerobot_policy(ckpt)
    norm, unnorm = _processor_steps(ckpt)
    out, meta = {}, {"checkpoint_tensor_hash": tensor_hash(ckpt / "model.safetensors"), "seed": SEED,
                     "lerobot": _version("lerobot"), "transformers": _version("transformers"),
                     "torch": torch.__version__, "cases": []}
    for case in CASES:
        tensors, info = _run_case(policy, config, norm, unnorm, ckpt, case)
        out |= {f"{case['name']}.{k}": v for k, v in tensors.items()}
        meta["cases"].append(info)
    from safetensors.numpy import save_file

    save_file(out, str(GOLDEN_TENSORS))
    GOLDEN_META.write_text(json.dumps(meta, indent=2) + "\n")


def _run_case(policy, config, norm, unnorm, ckpt: Path, case: dict):
    import numpy as np
    import sentencepiece
    import torch
    from lerobot.lerobot_types import TransitionKey
    from lerobot.policies.pi05.processor_pi05 import Pi05PrepareStateTokenizerProcessorStep

    images, noise = case_inputs(case)
    state = torch.tensor([case["state"]], dtype=torch.float32)
    transition = {TransitionKey.OBSERVATION: {"observation.state": state},
                  TransitionKey.COMPLEMENTARY_DATA: {"task": [case["prompt"]]}}
    transition = norm(transition)
    normalized = transition[TransitionKey.OBSERVATION]["observation.state"]
    transition = Pi05PrepareStateTokenizerProcessorStep(max_state_dim=32)(transition)
    text = transition[TransitionKey.COMPLEMENTARY_DATA]["task"][0]
    sp = sentencepiece.SentencePieceProcessor(model_file=str(ckpt / "tokenizer.model"))
    ids = sp.encode(text, add_bos=True)
    max_len = config.tokenizer_max_length
    tokens = torch.tensor([ids + [0] * (max_len - len(ids))])
    masks = torch.tensor([[True] * len(ids) + [False] * (max_len - len(ids))])
    batch = {f"observation.images.{cam}": torch.from_numpy(img).permute(2, 0, 1)[None].float() / 255.0
             for cam, img in images.items()}
    pixels, img_masks = policy._preprocess_images(batch)
    velocities, prefix = [], {}
    model = policy.model
    step = model.denoise_step

    def recording_step(prefix_pad_masks, past_key_values, x_t, timestep):
        if not prefix:
            valid = prefix_pad_masks[0]
            for layer in range(len(past_key_values.layers)):
                prefix[f"prefix_k.{layer}"] = past_key_values.layers[layer].keys[0][:, valid].numpy()
                prefix[f"prefix_v.{layer}"] = past_key_values.layers[layer].values[0][:, valid].numpy()
        v = step(prefix_pad_masks, past_key_values, x_t, timestep)
        velocities.append(v[0].numpy().copy())
        return v

    model.denoise_step = recording_step
    with torch.no_grad():
        x = model.sample_actions(pixels, img_masks, tokens, masks, noise=torch.from_numpy(noise)[None])
    model.denoise_step = step
    action_dim = config.output_features["action"].shape[0]
    actions = unnorm({TransitionKey.ACTION: x[:, :, :action_dim]})[TransitionKey.ACTION]
    tensors = {"noise": noise, "state": state[0].numpy(), "normalized_state": normalized[0].numpy(),
               "token_ids": np.asarray(ids, dtype=np.int64), "velocities": np.stack(velocities),
               "chunk": x[0].numpy(), "actions": actions[0].numpy(), **prefix,
               **{f"image.{cam}": img for cam, img in images.items()}}
    return tensors, {"name": case["name"], "prompt": case["prompt"], "full_prompt": text,
                     "cameras": list(images)}


def _tiny_lerobot_policy(ckpt: Path):
    """lerobot's PI05Policy at the checkpoint's tiny sizes, with the checkpoint's weights (strict)."""
    import lerobot.policies.pi05.modeling_pi05 as mp
    import torch
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.pi05 import PI05Config, PI05Policy
    from safetensors.torch import load_file
    from transformers import PaliGemmaConfig, SiglipVisionConfig
    from transformers.models.gemma.modeling_gemma import GemmaTextScaledWordEmbedding

    raw = json.loads((ckpt / "config.json").read_text())
    sizes = raw["walkserve_sizes"]
    gemma = {"gemma_2b": mp.GemmaConfig(**sizes["paligemma"]), "gemma_300m": mp.GemmaConfig(**sizes["expert"])}
    mp.get_gemma_config = lambda variant: gemma[variant]
    vision = {k: sizes["vision"][k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                              "num_attention_heads", "patch_size", "image_size")}
    real_mapping = mp.CONFIG_MAPPING

    class TinyMapping:
        def __getitem__(self, key):
            if key == "paligemma":
                return lambda **kw: PaliGemmaConfig(vision_config=SiglipVisionConfig(vision_use_head=False, **vision), **kw)
            return real_mapping[key]

    mp.CONFIG_MAPPING = TinyMapping()
    feats = raw["input_features"]
    config = PI05Config(
        dtype="float32", chunk_size=raw["chunk_size"], n_action_steps=raw["n_action_steps"],
        max_state_dim=raw["max_state_dim"], max_action_dim=raw["max_action_dim"],
        num_inference_steps=raw["num_inference_steps"], image_resolution=tuple(raw["image_resolution"]),
        tokenizer_max_length=raw["tokenizer_max_length"], device="cpu",
        input_features={k: PolicyFeature(FeatureType[v["type"]], tuple(v["shape"])) for k, v in feats.items()},
        output_features={k: PolicyFeature(FeatureType[v["type"]], tuple(v["shape"]))
                         for k, v in raw["output_features"].items()})
    policy = PI05Policy(config).eval()
    pg = policy.model.paligemma_with_expert.paligemma
    width, vocab = sizes["paligemma"]["width"], sizes["vocab_size"]
    pg.model.multi_modal_projector.linear = torch.nn.Linear(vision["hidden_size"], width)  # lerobot forces 2048
    for layer in pg.model.vision_tower.vision_model.encoder.layers:  # lerobot forces the So400m MLP (4304)
        layer.mlp.fc1 = torch.nn.Linear(vision["hidden_size"], vision["intermediate_size"])
        layer.mlp.fc2 = torch.nn.Linear(vision["intermediate_size"], vision["hidden_size"])
    pg.model.language_model.embed_tokens = GemmaTextScaledWordEmbedding(vocab, width, 0, embed_scale=width**0.5)
    pg.lm_head = torch.nn.Linear(width, vocab, bias=False)
    policy.model.paligemma_with_expert.gemma_expert.lm_head = torch.nn.Linear(
        sizes["expert"]["width"], vocab, bias=False)
    result = policy.load_state_dict(load_file(str(ckpt / "model.safetensors")), strict=True)
    print("lerobot load_state_dict(strict=True):", result)
    return policy, config


def _processor_steps(ckpt: Path):
    """lerobot's normaliser and unnormaliser steps from the checkpoint's processor files."""
    from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature
    from lerobot.processor import NormalizerProcessorStep, UnnormalizerProcessorStep
    from safetensors.torch import load_file

    steps = []
    for file, cls in (("policy_preprocessor.json", NormalizerProcessorStep),
                      ("policy_postprocessor.json", UnnormalizerProcessorStep)):
        step = json.loads((ckpt / file).read_text())["steps"][0]
        cfg = step["config"]
        features = {k: PolicyFeature(FeatureType[v["type"]], tuple(v["shape"])) for k, v in cfg["features"].items()}
        norm_map = {k: NormalizationMode[v] for k, v in cfg["norm_map"].items()}
        s = cls(features=features, norm_map=norm_map, eps=cfg["eps"])
        s.load_state_dict(load_file(str(ckpt / step["state_file"])))
        steps.append(s)
    return steps


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def _rewrite_py312_syntax() -> None:
    """Rewrite lerobot's PEP 695 constructs (type aliases, generic classes/functions) for Python 3.11, in place."""
    import re
    import sysconfig

    root = Path(sysconfig.get_paths()["purelib"]) / "lerobot"
    marker = "# rewritten for python 3.11\n"
    edits = {
        "processor/pipeline.py": [("class DataProcessorPipeline[TInput, TOutput](HubMixin):",
                                   "class DataProcessorPipeline(HubMixin, Generic[TInput, TOutput]):"),
                                  ("from typing import Any, TypedDict, TypeVar, cast",
                                   "from typing import Any, Generic, TypedDict, TypeVar, cast")],
        "datasets/streaming_dataset.py": [("class Backtrackable[T]:", "class Backtrackable(Generic[T]):"),
                                          ("from typing import Literal",
                                           "from typing import Generic, Literal, TypeVar\nT = TypeVar('T')")],
        "utils/io_utils.py": [("def deserialize_json_into_object[T: JsonLike](fpath: Path, obj: T) -> T:",
                               "T = TypeVar('T', bound=JsonLike)\n\n\n"
                               "def deserialize_json_into_object(fpath: Path, obj: T) -> T:"),
                              ("from typing import Any", "from typing import Any, TypeVar")],
        "motors/motors_bus.py": [], "datasets/aggregate.py": [],
    }
    if sys.version_info >= (3, 12):
        return
    for rel, subs in edits.items():
        path = root / rel
        text = path.read_text()
        if text.startswith(marker):
            continue
        for old, new in subs:
            text = text.replace(old, new, 1)
        text = re.sub(r"^type (\w+) = ", r"\1 = ", text, flags=re.M)
        path.write_text(marker + text)


def _stub_torchvision() -> None:
    """Make every ``torchvision.*`` import succeed with placeholder modules (lerobot imports it at module level)."""
    import importlib.abc
    import importlib.machinery
    import types

    import torch
    from transformers.utils import import_utils

    import_utils.is_torchvision_available()  # cache "not available" before the placeholders exist
    import_utils.is_torchvision_v2_available()

    class Placeholder(torch.nn.Module):
        def __init__(self, *args, **kwargs):
            super().__init__()

    class PlaceholderModule(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            cls = type(name, (Placeholder,), {"__module__": self.__name__})
            setattr(self, name, cls)
            return cls

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname, path, target=None):
            if fullname.split(".")[0] == "torchvision":
                return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            return None

        def create_module(self, spec):
            module = PlaceholderModule(spec.name)
            module.__path__ = []
            module.__version__ = "0.0.0"
            return module

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, Finder())


if __name__ == "__main__":
    main()
