"""``python benchmarks/prefix_keys.py`` runs (a smoke test: one repeat, no timing asserted)."""

from benchmarks.prefix_keys import main


def test_the_prefix_key_microbenchmark_runs(capsys):
    main(["--repeats", "1"])
    out = capsys.readouterr().out
    assert "token ids" in out and "media rows" in out and "capture cache run keys" in out
