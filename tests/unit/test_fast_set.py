"""The fast set stays fast: tests/conftest.py fails a test without ``slow`` or ``kernel``
that runs over its limit (here lowered to 0.2 s, so this test itself stays fast)."""
from __future__ import annotations

from pathlib import Path

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"


def test_an_unmarked_test_over_the_limit_fails_and_a_slow_one_passes(pytester):
    pytester.makeconftest(CONFTEST.read_text().replace("FAST_LIMIT_S = 5.0", "FAST_LIMIT_S = 0.2"))
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n    kernel: kernel\n")
    pytester.makepyfile("""
        import time, pytest
        def busy():                 # CPU, not a sleep: what either clock (DRL_FAST_CLOCK) counts
            t = time.process_time()
            while time.process_time() - t < 0.3:
                pass
        def test_unmarked(): busy()
        @pytest.mark.slow
        def test_marked(): busy()
        def test_quick(): pass
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*test_unmarked took * s*, over the fast set's 0.2 s*mark it @pytest.mark.slow*"])
