"""BAGEL on the shipped ``bagel-cfg-parallel`` placement (three CPU ranks): gen's passes on rank 0, cfg_text's
on rank 1, cfg_img's on rank 2, each context prefilled on its own rank, the CFG step on rank 0 gathering the
three velocities per step. Four requests at once (text-to-image, edit, think, understanding) end where the
offline loop does (<= 1e-4; the ``bagel`` placement is held to the same oracle in test_bagel_serving.py), and
every rank's LLM ran forwards.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.api.real_server import in_thread_server
from tests.models.bagel.test_bagel_serving import (
    T2I,
    TOL,
    array_input,
    cpu_placement,
    edit_oracle,
    final_latent,
    generate,
    ids,
    noise_of,
    picture,
    png_url,
    understand,
    understand_oracle,
)
from walkserve.models.bagel.flow import Guidance
from walkserve.models.bagel.layout import GEN_THINK_SYSTEM_PROMPT
from walkserve.models.bagel.offline import OfflineBagel

STEPS = 8


@pytest.fixture(scope="module")
def server(tiny_dir):
    with in_thread_server("bagel", tiny_dir, placement=cpu_placement("bagel-cfg-parallel")) as s:
        yield s


@pytest.fixture(scope="module")
def offline(parts, tokens) -> OfflineBagel:
    return OfflineBagel(parts, tokens)


def lm_forwards(server) -> dict[int, int]:
    server.call(server.engine.refresh_status())
    engines = server.engine.stats().engines
    return {rank: int(engines[f"lm@rank{rank}"]["forward_steps"]) for rank in (0, 1, 2)}


def test_four_at_once_on_three_ranks_equal_the_offline_loop(server, offline, tokenizer):
    image = picture(50, 70, 2)
    t2i_noise = noise_of(16, 31)  # 64x64
    edit_noise, edit_want = edit_oracle(offline, tokenizer, image, "add a hat", 32, seed=9, num_timesteps=STEPS)
    before = lm_forwards(server)
    jobs = {
        "t2i": lambda: generate(server, {"prompt": "a dog", "noise": array_input(t2i_noise)},
                                {"size": "64x64", "num_timesteps": STEPS, "cfg_renorm_type": "channel"}),
        "edit": lambda: generate(server, {"prompt": "add a hat", "image": {"type": "image", "url": png_url(image)},
                                          "noise": array_input(edit_noise)}, {"num_timesteps": STEPS},
                                 sampling={"seed": 9}),
        "think": lambda: generate(server, {"prompt": "a boat", "noise": array_input(t2i_noise[:8])},
                                  {"size": "32x64", "num_timesteps": STEPS, "think": True},
                                  sampling={"max_tokens": 5, "temperature": 0}),
        "und": lambda: understand(server, image, "what is here?", max_tokens=10),
    }
    with ThreadPoolExecutor(4) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        results = {name: f.result(180) for name, f in futures.items()}
    after = lm_forwards(server)
    t2i_want = offline.generate(ids(tokenizer, "a dog"), t2i_noise, size=(64, 64), num_timesteps=STEPS,
                                guidance=Guidance(4.0, 1.5, (0.4, 1.0), "channel", 0.0))
    think_want = offline.generate(ids(tokenizer, "a boat"), t2i_noise[:8], size=(64, 32), num_timesteps=STEPS,
                                  guidance=T2I, think_system_ids=ids(tokenizer, GEN_THINK_SYSTEM_PROMPT),
                                  max_think_tokens=5)
    assert (final_latent(results["t2i"], STEPS - 1) - t2i_want).abs().max() <= TOL
    assert (final_latent(results["edit"], STEPS - 1) - edit_want).abs().max() <= TOL
    assert (final_latent(results["think"], STEPS - 1) - think_want).abs().max() <= TOL
    assert results["und"] == understand_oracle(offline, tokenizer, image, "what is here?", 10)
    ran = {rank: after[rank] - before[rank] for rank in after}
    # cfg_text (rank 1) and cfg_img (rank 2): their prefill and at least one pass per flow step of a request
    assert ran[1] >= STEPS - 1 and ran[2] >= STEPS - 1 and ran[0] >= STEPS - 1, ran


def test_images_route_on_three_ranks(server):
    import base64
    import io

    import openai
    from PIL import Image

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    out = client.images.generate(prompt="two moons", size="32x32", extra_body={"seed": 4, "num_timesteps": 4})
    assert Image.open(io.BytesIO(base64.b64decode(out.data[0].b64_json))).size == (32, 32)
