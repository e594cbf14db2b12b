"""The tiers are marked from what a test does: a test that starts a process is slow, by its code, its
helpers or its directory, and one that starts a process without being marked fails (a platform probe
such as ``uname`` does not count)."""

from __future__ import annotations

from pathlib import Path

TIERS = Path(__file__).with_name("tiers.py")


def test_a_test_that_starts_a_process_is_slow_and_one_that_hides_it_fails(pytester):
    pytester.makeconftest(TIERS.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    slow: starts a process\n")
    pytester.makepyfile(
        test_tiered="""
        import subprocess

        def start_one():
            subprocess.run(["true"], check=True)

        def test_unit():
            assert sum([1, 2]) == 3

        def test_through_a_helper():
            start_one()

        def test_hidden_start():
            getattr(__import__("subpro" + "cess"), "run")(["true"], check=True)

        def test_a_platform_probe_is_not_a_process_tree():
            getattr(__import__("subpro" + "cess"), "run")(["uname", "-p"], capture_output=True, check=True)
        """
    )
    pytester.mkpydir("runtime").joinpath("test_in_runtime.py").write_text("def test_in_a_runtime_folder():\n    pass\n")

    quick = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-m", "not slow")
    quick.assert_outcomes(passed=2, failed=1, deselected=2)
    quick.stdout.fnmatch_lines(["*test_hidden_start started a process (subprocess.Popen true) but is not in the slow tier*"])

    full = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    full.assert_outcomes(passed=4, failed=1)
