"""Every model family on CUDA against the CPU, on the same tiny checkpoint loaded twice.

Language-model components (Llama/Qwen, Orpheus's LM, the Qwen3-Omni thinker,
talker and code predictor, BAGEL's MoT LLM): logits within 1e-4 in fp32, bf16
as accurate on CUDA as on the CPU (its difference recorded against 1e-3; see
``conftest.py``), and greedy tokens identical in fp32 (a dense loop recomputed from
scratch each step, so the comparison is of the model, not of a cache). Encoders,
codecs and flow heads (SNAC, Qwen3-Omni's audio/vision encoders and Code2Wav,
BAGEL's ViT and VAE, V-JEPA 2's encoder and predictors, pi0's action chunk):
fp32 outputs within 1e-4. Each family's tiny writer makes the checkpoint (no
oracle library is needed on the GPU machine).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from walkserve.engines.spec import Batch
from walkserve.layers.attention import DenseAttention

BOTH = [torch.float32, torch.bfloat16]
GEN_STEPS = 8


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _to(x, device, dtype=None):
    if isinstance(x, torch.Tensor):
        return x.to(device, dtype) if dtype is not None and x.is_floating_point() else x.to(device)
    return x


@torch.no_grad()
def lm_logits(model, device, ids, positions, embeds=None, dtype=None, **token_inputs) -> torch.Tensor:
    """Logits [T, V] (float32, CPU) of one dense causal pass."""
    hidden = model(_to(ids, device), _to(positions, device), DenseAttention("causal"),
                   inputs_embeds=None if embeds is None else embeds.to(device, dtype),
                   **{k: _to(v, device) for k, v in token_inputs.items()})
    return model.compute_logits(hidden).float().cpu()


@torch.no_grad()
def greedy(model, device, ids: list[int], positions, steps: int = GEN_STEPS) -> list[int]:
    """Greedy tokens of a dense loop: every step recomputes the whole sequence (``positions(n)`` for n tokens)."""
    seq = list(ids)
    for _ in range(steps):
        hidden = model(torch.tensor(seq, device=device), _to(positions(len(seq)), device), DenseAttention("causal"))
        seq.append(int(model.compute_logits(hidden[-1:]).argmax(-1)))
    return seq[len(ids):]


def _check_lm(load, device, parity, parity_bf16, name, vocab, positions, steps=GEN_STEPS, embeds_dim=None,
              **token_inputs):
    """The LM ``load(device, dtype)`` on ``device`` against the CPU: fp32 logits and greedy tokens, bf16 accuracy."""
    n = 12
    ids = torch.randint(3, vocab, (n,), generator=_g(n))
    embeds = None if embeds_dim is None else torch.randn(n, embeds_dim, generator=_g(7))
    logits = {}
    for dtype in BOTH:
        cpu, dev = load("cpu", dtype), load(device, dtype)
        logits["cpu", dtype] = lm_logits(cpu, "cpu", ids, positions(n), embeds, dtype, **token_inputs)
        logits["dev", dtype] = lm_logits(dev, device, ids, positions(n), embeds, dtype, **token_inputs)
        if dtype == torch.float32 and embeds_dim is None:
            assert greedy(dev, device, ids.tolist(), positions, steps) == greedy(cpu, "cpu", ids.tolist(), positions, steps)
    parity(f"{name} logits", logits["dev", torch.float32], logits["cpu", torch.float32], torch.float32)
    parity_bf16(f"{name} logits", logits["dev", torch.bfloat16], logits["cpu", torch.bfloat16],
                logits["cpu", torch.float32])


def _axes3(n: int) -> torch.Tensor:
    """[3, n] multimodal rope positions that differ between axes (t, h, w)."""
    t = torch.arange(n)
    return torch.stack([t, t // 2, t % 3 + t // 4])


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_text_lm(arch, device, parity, parity_bf16, tmp_path):
    from walkserve.models.llama.tiny import write_tiny
    from walkserve.models.llama.weights import load_causal_lm

    path = write_tiny(arch, tmp_path / arch, init_std=0.05)
    _check_lm(lambda d, t: load_causal_lm(path, device=d, dtype=t, progress=False), device, parity, parity_bf16, arch, 500,
              torch.arange)


@pytest.fixture(scope="module")
def orpheus_dir(tmp_path_factory):
    from walkserve.models.orpheus.tiny import write_tiny_orpheus

    return write_tiny_orpheus(tmp_path_factory.mktemp("orpheus"), lm="tiny", snac="tiny", seed=0)


def test_orpheus_lm_and_snac(orpheus_dir, device, parity, parity_bf16):
    from walkserve.models.llama.weights import load_causal_lm
    from walkserve.models.snac.weights import load_snac

    _check_lm(lambda d, t: load_causal_lm(orpheus_dir / "lm", device=d, dtype=t, progress=False), device, parity, parity_bf16,
              "orpheus lm", 128_000, torch.arange)
    codes = [torch.randint(0, 4096, (2, 4 * m), generator=_g(m)) for m in (1, 2, 4)]  # two 4-frame windows
    out = {}
    for where in ("cpu", device):
        snac = load_snac(orpheus_dir / "snac", device=where)
        with torch.no_grad():
            out[str(where)] = snac.decode(codes, [_g(1), _g(2)]).float().cpu()
    parity("snac decode", out[str(device)], out["cpu"], torch.float32)


@pytest.fixture(scope="module")
def omni_dir(tmp_path_factory):
    from walkserve.models.qwen3_omni.tiny import write_tiny_qwen3_omni

    return write_tiny_qwen3_omni(tmp_path_factory.mktemp("omni"), seed=3)


def test_qwen3_omni_thinker_and_encoders(omni_dir, device, parity, parity_bf16):
    from walkserve.models.qwen3_omni.thinker.image_processor import (
        VisionPreprocess,
        preprocess_image,
    )
    from walkserve.models.qwen3_omni.thinker.weights import load_thinker, load_thinker_components

    vocab = load_thinker(omni_dir, progress=False).config.vocab_size
    _check_lm(lambda d, t: load_thinker(omni_dir, device=d, dtype=t, progress=False), device, parity, parity_bf16,
              "qwen3-omni thinker", min(vocab, 1000), _axes3)
    image = preprocess_image(np.random.default_rng(0).integers(0, 256, (70, 100, 3), dtype=np.uint8),
                             VisionPreprocess(min_pixels=32 * 32, max_pixels=128 * 128))
    items = {"audio": [{"mel": torch.randn(128, 300, generator=_g(2))}],
             "vision": [{"pixel_values": torch.from_numpy(image.pixel_values), "grid_thw": torch.tensor(image.grid_thw)}]}
    out = {}
    for where in ("cpu", device):
        parts = load_thinker_components(omni_dir, device=where, progress=False)
        with torch.no_grad():
            out[str(where)] = {
                kind: [{k: v.float().cpu() for k, v in o.items()}
                       for o in getattr(parts, kind).forward_batch(Batch.of([{k: _to(v, where) for k, v in it.items()}
                                                                     for it in batch]))]
                for kind, batch in items.items()}
    for kind in items:
        for name, want in out["cpu"][kind][0].items():
            parity(f"qwen3-omni {kind} encoder {name}", out[str(device)][kind][0][name], want, torch.float32)


def test_qwen3_omni_speech(omni_dir, device, parity, parity_bf16):
    from walkserve.models.qwen3_omni.speech.weights import (
        load_code2wav,
        load_code_predictor,
        load_talker,
    )

    talker = load_talker(omni_dir, progress=False)
    _check_lm(lambda d, t: load_talker(omni_dir, device=d, dtype=t, progress=False), device, parity, parity_bf16,
              "qwen3-omni talker", talker.config.vocab_size, _axes3, embeds_dim=talker.config.hidden_size)
    predictor = load_code_predictor(omni_dir, progress=False)
    _check_lm(lambda d, t: load_code_predictor(omni_dir, device=d, dtype=t, progress=False), device, parity, parity_bf16,
              "qwen3-omni code predictor", predictor.config.vocab_size, torch.arange)
    cpu = load_code2wav(omni_dir, progress=False)
    cfg = cpu.config
    codes = torch.randint(0, cfg.codebook_size, (1, cfg.num_quantizers, 9), generator=_g(4))  # [1, Q, F]
    with torch.no_grad():
        want = cpu(codes).float()
        got = load_code2wav(omni_dir, device=device, progress=False)(codes.to(device)).float().cpu()
    parity("qwen3-omni code2wav", got, want, torch.float32)


@pytest.fixture(scope="module")
def bagel_dir(tmp_path_factory):
    from walkserve.models.bagel.tiny import write_tiny_bagel

    return write_tiny_bagel(tmp_path_factory.mktemp("bagel") / "tiny", seed=1)


def test_bagel(bagel_dir, device, parity, parity_bf16):
    from walkserve.models.bagel.weights import load_bagel

    cpu = load_bagel(bagel_dir)
    d = cpu.config.hidden_size
    expert = torch.tensor([0] * 6 + [1] * 6)  # understanding rows, then generation rows
    _check_lm(lambda where, t: load_bagel(bagel_dir, device=where, dtype=t).lm, device, parity, parity_bf16, "bagel lm (text)",
              300, torch.arange)
    _check_lm(lambda where, t: load_bagel(bagel_dir, device=where, dtype=t).lm, device, parity, parity_bf16,
              "bagel lm (both experts)", 300, torch.arange, embeds_dim=d, expert=expert)
    dev = load_bagel(bagel_dir, device=device)
    p = cpu.config.vit.patch_size
    pixels = torch.rand(3, 3 * p, 5 * p, generator=_g(3)) * 2 - 1
    image = torch.rand(3, 48, 64, generator=_g(4)) * 2 - 1
    eps = torch.randn(16, 6, 8, generator=_g(5))
    z = torch.randn(1, 16, 6, 8, generator=_g(6))
    with torch.no_grad():
        outs = [(parts.vit.forward_items([{"pixels": pixels.to(where)}])[0]["embeds"].float().cpu(),
                 parts.vae_encoder.forward_items([{"image": image.to(where), "eps": eps.to(where)}])[0]["latents"]
                 .float().cpu(),
                 parts.vae_decoder.decode(z.to(where)).float().cpu())
                for parts, where in ((cpu, "cpu"), (dev, device))]
    for name, want, got in zip(("vit", "vae encoder", "vae decoder"), *outs):
        parity(f"bagel {name}", got, want, torch.float32)


def test_vjepa2(device, parity, tmp_path):
    from walkserve.models.vjepa2.rollout import normalize_features, official_rollout
    from walkserve.models.vjepa2.tiny import write_tiny_vjepa2, write_tiny_vjepa2_ac
    from walkserve.models.vjepa2.weights import (
        load_ac_predictor,
        load_encoder,
        load_masked_predictor,
    )

    hf = write_tiny_vjepa2(tmp_path / "hf", seed=3)
    ac = write_tiny_vjepa2_ac(tmp_path / "ac", preset="tiny", seed=5)
    x = torch.randn(1, 3, 4, 64, 64, generator=_g(0))  # [B, C, T, H, W]
    ctx, tgt = torch.tensor([[0, 3, 5, 7, 9, 11, 13, 20, 25, 30]]), torch.tensor([[31, 1, 2, 4, 6, 8, 17, 18, 19]])
    out = {}
    for where in ("cpu", device):
        encoder, predictor = load_encoder(hf, device=where), load_masked_predictor(hf, device=where)
        model = load_ac_predictor(ac, device=where)
        cfg = model.config
        g = _g(1)
        frames = normalize_features(torch.randn(1, cfg.frame_tokens, cfg.input_size, generator=g)).to(where)
        actions = (0.05 * torch.randn(4, cfg.action_dim, generator=g)).to(where)
        states = torch.rand(1, cfg.action_dim, generator=g).to(where)
        with torch.no_grad():
            features = encoder(x.to(where))
            out[str(where)] = {"encoder": features.float().cpu(),
                               "masked predictor": predictor(features[:, ctx[0]], ctx.to(where), tgt.to(where))
                               .float().cpu(),
                               "ac rollout (4 steps)": official_rollout(model, frames, actions, states, 4).float().cpu()}
    for name, want in out["cpu"].items():
        parity(f"v-jepa 2 {name}", out[str(device)][name], want, torch.float32)


def test_pi0_action_chunk(device, parity, tmp_path):
    from walkserve.models.pi0.files import load_policy_files
    from walkserve.models.pi0.inputs import InputSpec, validate_inputs
    from walkserve.models.pi0.predict import predict_actions
    from walkserve.models.pi0.tiny import write_tiny_policy
    from walkserve.models.pi0.weights import load_policy

    path = write_tiny_policy("pi0", tmp_path / "pi0", seed=1)
    files = load_policy_files(path)
    out = {}
    for where in ("cpu", device):
        policy = load_policy(path, device=where, progress=False)
        rng = np.random.default_rng(2)
        spec = InputSpec.from_config(policy.config)
        raw = {cam: rng.integers(0, 256, size=(28, 28, 3), dtype=np.uint8) for cam in policy.config.cameras}
        raw |= {"state": rng.uniform(-1.5, 1.5, 8), "prompt": "pick up the red cube",
                "noise": rng.standard_normal((10, 32)).astype(np.float32)}
        with torch.no_grad():
            pred = predict_actions(policy, files, validate_inputs(spec, raw))
        out[str(where)] = (torch.as_tensor(pred.chunk).float().cpu(),
                           torch.stack([torch.as_tensor(v).float().cpu() for v in pred.velocities]))
    parity("pi0 action chunk (10 flow steps)", out[str(device)][0], out["cpu"][0], torch.float32)
    parity("pi0 flow velocities", out[str(device)][1], out["cpu"][1], torch.float32)
