"""The parity guard turns a skipped oracle into a failure, except where the skip is for want of a GPU."""

from __future__ import annotations

from pathlib import Path

GUARD = Path(__file__).with_name("parity_guard.py")


def test_a_skipped_parity_test_fails_unless_it_needs_a_gpu(pytester):
    pytester.makeconftest(GUARD.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    parity: numeric parity against a reference\n")
    pytester.makepyfile(
        test_oracles="""
        import pytest

        @pytest.mark.parity
        def test_oracle_without_its_reference():
            pytest.importorskip("no_such_reference_package")

        @pytest.mark.parity
        @pytest.mark.skipif(True, reason="needs a CUDA device")
        def test_gpu_only_oracle():
            pass

        @pytest.mark.parity
        def test_oracle_that_runs():
            pass

        def test_plain_skip_is_a_skip():
            pytest.skip("not an oracle")
        """,
        test_parity_module="""
        import pytest

        pytestmark = pytest.mark.parity
        helper = pytest.importorskip("no_such_first_party_helper")

        def test_never_collected():
            pass
        """,
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--continue-on-collection-errors")
    result.assert_outcomes(passed=1, failed=1, skipped=2, errors=1)
    result.stdout.fnmatch_lines(["*test_oracle_without_its_reference is marked parity but was skipped*"])
