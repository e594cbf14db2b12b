"""``./dev bench moe --quick`` prints one row per token count with all three timings."""

from __future__ import annotations

import re

from benchmarks import moe


def test_quick_moe_benchmark_prints_the_table(capsys):
    assert moe.main(["--quick", "--tokens", "1,16", "--repeats", "1", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "| tokens | experts used | moe ms | dense-equivalent ms | per-expert loop ms | moe / dense |" in out
    rows = re.findall(r"^\| (\d+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|", out, re.MULTILINE)
    assert [r[0] for r in rows] == ["1", "16"] and all(float(v) > 0 for r in rows for v in r[2:])


def test_the_loop_baseline_computes_the_same_function():
    import torch

    layer, _ = moe.build(64, 32, 8, 2, torch.float32)
    x = torch.randn(13, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(moe.loop_experts(layer, x), layer(x), rtol=1e-5, atol=1e-5)
