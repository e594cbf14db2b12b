"""The pieces every family shares: the config reader's errors, the dtype rule, KV sizing and rank budgets."""

from __future__ import annotations

import pytest
import torch

from walkserve.core.errors import ConfigError
from walkserve.core.options import KVOptions
from walkserve.models.common.config_files import read_config_json
from walkserve.models.common.dtypes import resolve_dtype, torch_dtype
from walkserve.models.common.kv_sizing import has_pool_size, kv_bytes_per_token, kv_pool_bytes
from walkserve.models.common.lm_config import LMConfig
from walkserve.models.common.memory_report import GIB, rank_budget
from walkserve.placement.plan import RankSpec

CPU_DEFAULT = 256 << 20


def test_read_config_json_from_a_directory_or_a_file(tmp_path):
    (tmp_path / "config.json").write_text('{"a": 1}')
    (tmp_path / "other.json").write_text('{"b": 2}')
    assert read_config_json(tmp_path) == {"a": 1}
    assert read_config_json(tmp_path / "config.json") == {"a": 1}
    assert read_config_json(tmp_path, "other.json") == {"b": 2}


def test_read_config_json_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"config\.json does not exist \(no config\.json in "):
        read_config_json(tmp_path)
    (tmp_path / "config.json").write_text("{nope")
    with pytest.raises(ConfigError, match=r"^SNAC checkpoint: .*config\.json is not valid JSON"):
        read_config_json(tmp_path, label="SNAC checkpoint: ")
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match=r"config\.json must hold a JSON object"):
        read_config_json(tmp_path)


def test_every_family_config_reader_raises_the_same_errors(tmp_path):
    from walkserve.models.bagel.config import BagelConfig
    from walkserve.models.qwen3_omni.config import Qwen3OmniConfig
    from walkserve.models.qwen3_omni.speech.config import SpeechConfig
    from walkserve.models.snac.config import SnacConfig

    (tmp_path / "config.json").write_text("[]")
    readers = [LMConfig.from_file, Qwen3OmniConfig.from_file, SpeechConfig.from_file, BagelConfig.from_dir,
               lambda p: SnacConfig.from_file(p / "config.json")]
    for read in readers:
        with pytest.raises(ConfigError, match="must hold a JSON object"):
            read(tmp_path)


def test_dtype_names_torch_dtypes_and_the_checkpoint_default():
    config = LMConfig("LlamaForCausalLM", 8, 16, 1, 2, 1, 4, 32, dtype="bfloat16")
    assert resolve_dtype(None, config) is torch.bfloat16
    assert resolve_dtype("torch.float16", config) is torch.float16
    assert resolve_dtype(torch.float32, config) is torch.float32
    assert torch_dtype(None, "float32") is torch.float32
    with pytest.raises(ConfigError, match="unsupported weight dtype 'int8'"):
        torch_dtype("int8", "float32")
    with pytest.raises(ConfigError, match="unsupported weight dtype torch.float64"):
        torch_dtype(torch.float64, "float32")


def test_kv_bytes_per_token_of_a_released_model():
    # BAGEL's Qwen2.5-7B LLM: 28 layers, 4 KV heads of 128, bf16 -> 56 KiB a token
    assert kv_bytes_per_token(28, 4, 128, 2) == 56 * 1024


@pytest.mark.parametrize("options", [KVOptions(kv_bytes=5000, num_blocks=3), {"kv_bytes": 5000, "num_blocks": 3}])
def test_kv_bytes_win(options):
    assert has_pool_size(options)
    assert kv_pool_bytes(options, 100, "cuda:0", None) == 5000


@pytest.mark.parametrize("options", [KVOptions(num_blocks=3, block_size=8), {"num_blocks": "3", "block_size": 8},
                                     {"num_blocks": 3, "block_size": 8, "kv_bytes": None, "max_running": 4}])
def test_blocks_times_block_size_times_bytes_per_token(options):
    assert kv_pool_bytes(options, 100, "cpu", None) == 3 * 8 * 100


def test_blocks_take_the_default_block_size():
    assert kv_pool_bytes({"num_blocks": 2}, 10, "cpu", None) == 2 * 16 * 10


def test_no_size_takes_the_device_default():
    assert not has_pool_size({"block_size": 16, "kv_bytes": 0})
    assert kv_pool_bytes({}, 100, "cpu", None) == CPU_DEFAULT
    assert kv_pool_bytes(KVOptions(), 100, "cuda:0", 10 * GIB) == kv_pool_bytes({}, 1, "cuda", 10 * GIB)
    assert 0 < kv_pool_bytes({}, 100, "cuda:0", 10 * GIB) < 10 * GIB
    with pytest.raises(ValueError, match="unknown here"):
        kv_pool_bytes({}, 100, "cuda:0", None)


def test_a_bad_sizing_option_is_a_config_error():
    with pytest.raises(ConfigError, match="kv engine option"):
        kv_pool_bytes({"num_blocks": -2}, 100, "cpu", None)


def test_rank_budget_is_the_placement_memory_else_the_gpu_memory():
    gpu_memory = {"cuda:0": 80 * GIB}.get
    assert rank_budget(RankSpec(0, "cuda:0", memory=16 * GIB), gpu_memory) == 16 * GIB
    assert rank_budget(RankSpec(0, "cuda:0"), gpu_memory) == 80 * GIB
    assert rank_budget(RankSpec(0, "cuda:0"), None) is None
    assert rank_budget(RankSpec(0, "cpu"), gpu_memory) is None
