"""The shared SigLIP tower against transformers' SiglipVisionModel on the same tiny weights."""

import pytest
import torch

from walkserve.models.common.checkpoint import SafetensorsCheckpoint, load_into
from walkserve.models.siglip.config import SiglipVisionConfig
from walkserve.models.siglip.tower import SiglipVisionTower, grid_position_ids, patchify

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.parity

TINY = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_channels": 3, "image_size": 28, "patch_size": 7, "layer_norm_eps": 1e-6,
        "hidden_act": "gelu_pytorch_tanh"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    torch.manual_seed(0)
    ref = transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**TINY)).eval()
    with torch.no_grad():
        for p in ref.parameters():  # visible everywhere: no near-identity layer norms or zero biases
            p.add_(torch.randn_like(p) * 0.05)
    out = tmp_path_factory.mktemp("siglip")
    ref.save_pretrained(out)
    ours = SiglipVisionTower(SiglipVisionConfig.from_dict(TINY))
    ckpt = SafetensorsCheckpoint(out)  # transformers 5 writes the names without the vision_model. prefix
    load_into(ours, ckpt, ignored=[n for n in ckpt.names() if n.startswith("head.")], progress=False)
    return ref, ours.eval()


@torch.no_grad()
def test_square_images_equal_the_reference(pair):
    ref, ours = pair
    pixels = torch.randn(2, 3, 28, 28)
    want = ref(pixel_values=pixels).last_hidden_state
    torch.testing.assert_close(ours.forward_images(pixels), want, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_packed_images_of_other_sizes_equal_each_image_alone(pair):
    _, ours = pair
    images = [torch.randn(3, 14, 21), torch.randn(3, 28, 28), torch.randn(3, 21, 14)]
    side = ours.config.patches_per_side
    patches, positions, lengths, alone = [], [], [], []
    for img in images:
        h, w = img.shape[1] // 7, img.shape[2] // 7
        patches.append(patchify(img, 7))
        positions.append(grid_position_ids(h, w, side))
        lengths.append(h * w)
        alone.append(ours(patches[-1], positions[-1], [h * w]))
    packed = ours(torch.cat(patches), torch.cat(positions), lengths)
    torch.testing.assert_close(packed, torch.cat(alone), atol=1e-5, rtol=1e-5)


def test_patchify_is_the_convolution_order():
    conv = torch.nn.Conv2d(3, 5, 7, stride=7)
    img = torch.randn(3, 14, 21)
    want = conv(img[None])[0].flatten(1).T  # [h*w, 5]
    got = patchify(img, 7) @ conv.weight.reshape(5, -1).T + conv.bias
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
