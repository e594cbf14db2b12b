"""BAGEL through the real runtime and its HTTP routes, against the offline loop (the oracle, OfflineBagel).

One server for the module (the tiny checkpoint on the shipped ``bagel`` placement, rewritten to the CPU):
text-to-image and edit with an explicit initial noise end at the offline loop's latent (<= 1e-4), alone
and four at a time mixed with understanding and think mode; understanding's greedy tokens equal the
offline loop's; the flow's three guidance passes run as one KV forward per step; bad input is a 400
naming its field.
"""

from __future__ import annotations

import base64
import io
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import torch
import yaml
from PIL import Image

from tests.api.real_server import in_thread_server
from walkserve.cli.placement_arg import placement_path
from walkserve.models.bagel.config import BagelConfig
from walkserve.models.bagel.flow import Guidance
from walkserve.models.bagel.inputs import ImageRules
from walkserve.models.bagel.layout import GEN_THINK_SYSTEM_PROMPT, VLM_THINK_SYSTEM_PROMPT
from walkserve.models.bagel.offline import EditImage, OfflineBagel
from walkserve.models.bagel.preprocess import image_inputs

T2I = Guidance(4.0, 1.5, (0.4, 1.0), "global", 0.0)  # the task defaults
EDIT = Guidance(4.0, 2.0, (0.0, 1.0), "text_channel", 0.0)
TOL = 1e-4


def cpu_placement(name: str) -> dict:
    """A shipped placement with every rank on the CPU."""
    data = yaml.safe_load(placement_path(name).read_text())
    for rank in data["ranks"]:
        rank["device"] = "cpu"
    return data


@pytest.fixture(scope="module")
def server(tiny_dir):
    with in_thread_server("bagel", tiny_dir, placement=cpu_placement("bagel")) as s:
        yield s


@pytest.fixture(scope="module")
def offline(parts, tokens, tokenizer) -> OfflineBagel:
    return OfflineBagel(parts, tokens)


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def noise_of(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, 64, generator=torch.Generator().manual_seed(seed))


def array_input(t: torch.Tensor) -> dict:
    return {"type": "array", "dtype": "float32", "shape": list(t.shape), "data": base64.b64encode(t.numpy().tobytes()).decode()}


def picture(width: int, height: int, seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


def png_url(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def latent_of(output: dict) -> torch.Tensor:
    data = output["data"]
    return torch.from_numpy(np.frombuffer(base64.b64decode(data["data"]), dtype=np.float32).reshape(data["shape"]).copy())


def generate(server, inputs: dict, params: dict, **body) -> dict:
    payload = {"task": "image", "inputs": inputs, "params": params, "modalities": ["latent"], "stream": False, **body}
    r = httpx.post(f"{server.url}/v1/generate", json=payload, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def final_latent(result: dict, steps: int) -> torch.Tensor:
    latents = [o for o in result["outputs"] if o["modality"] == "latent"]
    assert [o["index"] for o in latents] == list(range(steps))  # every step's latent, streamed in order
    return latent_of(latents[-1])


def edit_oracle(offline, tokenizer, image: Image.Image, prompt: str, noise_seed: int, seed: int, **kw):
    vae, vit = image_inputs(image, *_rules(offline))
    n = (vae.shape[1] // 16) * (vae.shape[2] // 16)
    noise = noise_of(n, noise_seed)
    kw.setdefault("guidance", EDIT)
    return noise, offline.generate(ids(tokenizer, prompt), noise, image=EditImage(vae, vit, seed=seed + 1), **kw)


def _rules(offline):
    rules = ImageRules.of(offline.parts.config)
    return rules.vae, rules.vit


def lm_forwards(server) -> int:
    server.call(server.engine.refresh_status())
    return int(server.engine.stats().engines["lm@rank0"]["forward_steps"])


# ---- generation --------------------------------------------------------------------------------
def test_text_to_image_equals_the_offline_loop_with_one_forward_per_step(server, offline, tokenizer):
    """49 steps (the default 50 timesteps) of three passes each: one KV forward per step, the same latent."""
    noise = noise_of(8, 7)  # 64x32: 2 x 4 latent tokens
    before = lm_forwards(server)
    result = generate(server, {"prompt": "a red cube", "noise": array_input(noise)}, {"size": "64x32"},
                      sampling={"seed": 3})
    forwards = lm_forwards(server) - before
    want = offline.generate(ids(tokenizer, "a red cube"), noise, size=(32, 64), guidance=T2I)
    assert (final_latent(result, 49) - want).abs().max() <= TOL
    assert 49 <= forwards <= 49 + 2  # the prefill (gen and cfg_img), then one forward per flow step (not 3)


def test_edit_equals_the_offline_loop(server, offline, tokenizer):
    image = picture(90, 60, 1)
    noise, want = edit_oracle(offline, tokenizer, image, "make it blue", 11, seed=5)
    result = generate(server, {"prompt": "make it blue", "image": {"type": "image", "url": png_url(image)},
                               "noise": array_input(noise)}, {}, sampling={"seed": 5})
    assert (final_latent(result, 49) - want).abs().max() <= TOL


def test_four_at_once_mixing_generation_edit_understanding_and_think(server, offline, tokenizer):
    """Concurrency 4 (the understanding request joins while the flows run): each equals its offline run."""
    steps = 12
    image = picture(50, 70, 2)
    t2i_noise = noise_of(16, 21)  # 64x64
    edit_noise, edit_want = edit_oracle(offline, tokenizer, image, "add a hat", 22, seed=9, num_timesteps=steps)
    jobs = {
        "t2i": lambda: generate(server, {"prompt": "a dog", "noise": array_input(t2i_noise)},
                                {"size": "64x64", "num_timesteps": steps, "cfg_renorm_type": "channel"}),
        "edit": lambda: generate(server, {"prompt": "add a hat", "image": {"type": "image", "url": png_url(image)},
                                          "noise": array_input(edit_noise)}, {"num_timesteps": steps},
                                 sampling={"seed": 9}),
        "think": lambda: generate(server, {"prompt": "a boat", "noise": array_input(t2i_noise[:8])},
                                  {"size": "32x64", "num_timesteps": steps, "think": True},
                                  sampling={"max_tokens": 6, "temperature": 0}),
        "und": lambda: understand(server, image, "what is here?", max_tokens=12),
    }
    with ThreadPoolExecutor(4) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        results = {name: f.result(120) for name, f in futures.items()}
    t2i_want = offline.generate(ids(tokenizer, "a dog"), t2i_noise, size=(64, 64), num_timesteps=steps,
                                guidance=Guidance(4.0, 1.5, (0.4, 1.0), "channel", 0.0))
    think_want = offline.generate(ids(tokenizer, "a boat"), t2i_noise[:8], size=(64, 32), num_timesteps=steps,
                                  guidance=T2I, think_system_ids=ids(tokenizer, GEN_THINK_SYSTEM_PROMPT),
                                  max_think_tokens=6)
    assert (final_latent(results["t2i"], steps - 1) - t2i_want).abs().max() <= TOL
    assert (final_latent(results["edit"], steps - 1) - edit_want).abs().max() <= TOL
    assert (final_latent(results["think"], steps - 1) - think_want).abs().max() <= TOL
    assert len([o for o in results["think"]["outputs"] if o["modality"] == "text"]) == 6  # the plan's tokens
    assert results["und"] == understand_oracle(offline, tokenizer, image, "what is here?", 12)


# ---- understanding -----------------------------------------------------------------------------
def understand(server, image: Image.Image, question: str, max_tokens: int, think: bool | None = None) -> str:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    extra = {"think": think} if think is not None else None
    reply = client.chat.completions.create(
        model="tiny", max_tokens=max_tokens, temperature=0, extra_body=extra,
        messages=[{"role": "user", "content": [{"type": "text", "text": question},
                                               {"type": "image_url", "image_url": {"url": png_url(image)}}]}])
    return reply.choices[0].message.content


def understand_oracle(offline, tokenizer, image, question, max_tokens, system=None) -> str:
    vae_rule, vit_rule = _rules(offline)
    _, vit = image_inputs(image, vae_rule, vit_rule)
    out = offline.understand(ids(tokenizer, question), [vit], max_new_tokens=max_tokens,
                             system_ids=None if system is None else ids(tokenizer, system))
    return tokenizer.decode(out)


def test_understanding_and_think_mode_give_the_offline_loops_greedy_tokens(server, offline, tokenizer):
    image = picture(64, 40, 3)
    assert understand(server, image, "describe it", 16) == understand_oracle(offline, tokenizer, image, "describe it", 16)
    assert understand(server, image, "why?", 16, think=True) == understand_oracle(
        offline, tokenizer, image, "why?", 16, system=VLM_THINK_SYSTEM_PROMPT)


# ---- the OpenAI image routes -------------------------------------------------------------------
def test_images_generations_and_edits_routes(server, offline, tiny_dir):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    out = client.images.generate(prompt="two moons", n=2, size="64x32", output_format="png", extra_body={
        "seed": 4, "num_timesteps": 6, "cfg_text_scale": 3.0, "cfg_img_scale": 1.2, "cfg_interval": [0.0, 1.0],
        "cfg_renorm_type": "channel", "cfg_renorm_min": 0.1, "timestep_shift": 2.0, "think": False})
    pictures = [Image.open(io.BytesIO(base64.b64decode(d.b64_json))) for d in out.data]
    assert [p.size for p in pictures] == [(64, 32), (64, 32)]
    assert np.asarray(pictures[0]).tobytes() != np.asarray(pictures[1]).tobytes()  # seeds 4 and 5
    proc_ids = server.engine.processor.tokenize("two moons")
    want = offline.generate(proc_ids, noise_of(8, 4), size=(32, 64), num_timesteps=6, shift=2.0,
                            guidance=Guidance(3.0, 1.2, (0.0, 1.0), "channel", 0.1))
    want_pixels = offline.decode_image(want, (32, 64)).numpy().astype(int)
    assert np.abs(np.asarray(pictures[0]).astype(int) - want_pixels).max() <= 1

    buf = io.BytesIO()
    picture(40, 30, 4).save(buf, format="PNG")
    r = httpx.post(f"{server.url}/v1/images/edits", timeout=60, files={"image": ("in.png", buf.getvalue(), "image/png")},
                   data={"prompt": "sharper", "num_timesteps": "4", "cfg_interval": "0.1,1.0", "output_format": "png"})
    assert r.status_code == 200, r.text
    edited = Image.open(io.BytesIO(base64.b64decode(r.json()["data"][0]["b64_json"])))
    rules = ImageRules.of(BagelConfig.from_dir(tiny_dir))
    assert edited.size == rules.vae.fit(40, 30)  # the output keeps the VAE-resized input size


@pytest.mark.parametrize("size", [None, "auto"])
def test_text_to_image_without_a_size_takes_the_largest_the_checkpoint_covers(server, tiny_dir, size):
    """The release's default 1024x1024 is past the tiny latent position table: the default is cut to the table."""
    side = BagelConfig.from_dir(tiny_dir).max_image_side
    assert side < 1024
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    out = client.images.generate(prompt="a lake", **({"size": size} if size else {}),
                                 extra_body={"seed": 3, "num_timesteps": 3})
    assert Image.open(io.BytesIO(base64.b64decode(out.data[0].b64_json))).size == (side, side)
    payload = {"task": "image", "inputs": {"prompt": "a lake"}, "params": {"num_timesteps": 3, "size": size},
               "modalities": ["image"], "sampling": {"seed": 3}, "image_format": "raw", "stream": False}
    r = httpx.post(f"{server.url}/v1/generate", json=payload, timeout=60)
    assert r.status_code == 200, r.text[:300]
    assert [o["data"]["shape"] for o in r.json()["outputs"] if o["modality"] == "image"] == [[side, side, 3]]


def test_a_size_past_the_latent_table_is_a_400_naming_the_allowed_range(server, tiny_dir):
    side = BagelConfig.from_dir(tiny_dir).max_image_side
    r = httpx.post(f"{server.url}/v1/images/generations", json={"prompt": "x", "size": f"{side + 16}x{side}"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "size"
    assert f"[16, {side}]" in r.json()["error"]["message"]


def test_openai_images_edit_sends_numbers_as_form_strings_and_they_parse(server, offline, tokenizer):
    """The openai package sends images.edit as multipart: extra_body's seed, numbers and the interval list arrive as
    strings (``cfg_interval[]`` once per item); the edit equals the offline loop with those settings."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    image = picture(40, 30, 6)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    out = client.images.edit(image=("in.png", buf.getvalue(), "image/png"), prompt="sharper", n=2, extra_body={
        "seed": 7, "num_timesteps": 4, "cfg_text_scale": 3.0, "cfg_img_scale": 1.5, "cfg_interval": [0.1, 1.0],
        "timestep_shift": 2.0, "think": False, "output_format": "png"})
    pictures = [np.asarray(Image.open(io.BytesIO(base64.b64decode(d.b64_json)))).astype(int) for d in out.data]
    assert len(pictures) == 2 and not np.array_equal(pictures[0], pictures[1])  # seeds 7 and 8
    _, want = edit_oracle(offline, tokenizer, image, "sharper", 7, seed=7, num_timesteps=4, shift=2.0,
                          guidance=Guidance(3.0, 1.5, (0.1, 1.0), "text_channel", 0.0))
    assert np.abs(pictures[0] - offline.decode_image(want, pictures[0].shape[:2]).numpy().astype(int)).max() <= 1


@pytest.mark.parametrize(("field", "value"), [("seed", "-1"), ("seed", "x"), ("n", "0"), ("num_timesteps", "1.5"),
                                              ("cfg_interval[]", "0.5")])
def test_a_bad_number_in_the_edit_form_is_a_400_naming_it(server, field, value):
    r = httpx.post(f"{server.url}/v1/images/edits", timeout=30, data={"prompt": "x", field: value},
                   files={"image": ("in.png", _png_bytes(picture(16, 16, 1)), "image/png")})
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"]["param"] == field.removesuffix("[]")


def _png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def test_generate_streams_each_steps_latent_as_ndjson(server):
    payload = {"task": "image", "inputs": {"prompt": "rain"}, "params": {"size": "32x32", "num_timesteps": 5},
               "modalities": ["latent", "image"], "sampling": {"seed": 1}, "image_format": "raw"}
    with httpx.stream("POST", f"{server.url}/v1/generate", json=payload, timeout=60) as r:
        events = [json.loads(line) for line in r.iter_lines() if line]
    kinds = [(e.get("modality"), e["type"]) for e in events]
    assert kinds == [("latent", "output")] * 4 + [("image", "output"), (None, "finished")]
    assert events[-2]["data"]["shape"] == [32, 32, 3]


def test_generate_streams_each_steps_preview_then_the_image(server):
    payload = {"task": "image", "inputs": {"prompt": "snow"}, "params": {"size": "32x48", "num_timesteps": 4},
               "modalities": ["preview"], "sampling": {"seed": 2}, "image_format": "raw"}
    with httpx.stream("POST", f"{server.url}/v1/generate", json=payload, timeout=60) as r:
        outputs = [e for e in (json.loads(line) for line in r.iter_lines() if line) if e["type"] == "output"]
    assert [(e["modality"], e["node"], e["iteration"]) for e in outputs] == [
        ("image", "preview", [0]), ("image", "preview", [1]), ("image", "preview", [2]), ("image", "vae_decoder", [])]
    assert outputs[0]["data"]["shape"] == [48, 32, 3]
    assert outputs[-2]["data"] == outputs[-1]["data"]  # the last step's preview is the image


@pytest.mark.parametrize(("route", "body", "param"), [
    ("images/generations", {"prompt": "x", "size": "40x32"}, "size"),  # not a multiple of 16
    ("images/generations", {"prompt": "x", "size": "1024x1024"}, "size"),  # past the tiny latent table (128)
    ("generate", {"task": "image", "inputs": {"prompt": "x"}, "params": {"size": "128x144"}}, "size"),
    ("images/generations", {"prompt": "x", "cfg_text_scale": 25}, "cfg_text_scale"),
    ("images/generations", {"prompt": "x", "cfg_interval": [0.9, 0.1]}, "cfg_interval"),
    ("images/generations", {"prompt": "x", "cfg_renorm_type": "loud"}, "cfg_renorm_type"),
    ("images/generations", {"prompt": "x", "n": 9}, "n"),
    ("images/generations", {"prompt": "x", "num_timesteps": 1}, "num_timesteps"),
    ("generate", {"task": "image", "inputs": {"prompt": "x", "noise": {"type": "array", "dtype": "float32",
                  "shape": [3, 64], "data": base64.b64encode(bytes(3 * 64 * 4)).decode()}},
                  "params": {"size": "32x32"}}, "noise"),  # task image: the inputs are the payload's fields
    ("generate", {"task": "generate", "modalities": ["image"], "inputs": {"prompt": "x", "noise": {"type": "array",
                  "dtype": "float32", "shape": [4, 63], "data": base64.b64encode(bytes(4 * 63 * 4)).decode()}},
                  "params": {"size": "32x32"}}, "inputs.noise"),
    ("generate", {"task": "image", "inputs": {"prompt": "x", "image": {"type": "image", "url":
                  "data:image/png;base64," + base64.b64encode(b"not a png").decode()}}}, "inputs.image.url"),
])
def test_bad_input_is_a_400_naming_the_field(server, route, body, param):
    r = httpx.post(f"{server.url}/v1/{route}", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_an_unreadable_edit_image_is_a_400_naming_it(server):
    r = httpx.post(f"{server.url}/v1/images/edits", timeout=30, files={"image": ("x.png", b"garbage", "image/png")},
                   data={"prompt": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "image[0]"


def test_an_edit_mask_is_a_400_naming_it_not_ignored(server):
    """BAGEL edits the whole image from the instruction; a client's inpainting mask would be silently dropped."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    png = _png_bytes(picture(16, 16, 1))
    with pytest.raises(openai.BadRequestError) as info:
        client.images.edit(image=("in.png", png, "image/png"), mask=("mask.png", png, "image/png"), prompt="x",
                           extra_body={"num_timesteps": 2})
    assert info.value.body["param"] == "mask"


def test_checkpoint_dir_is_detected(tiny_dir):
    from walkserve.cli.serve_target import detect_family

    assert detect_family(str(tiny_dir), None) == "bagel"
    assert Path(tiny_dir, "ema.safetensors").is_file()
