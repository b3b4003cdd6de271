"""A small pure-Python package with its own pytest suite, written to disk on demand.

The tests and the benchmark build SWE tasks from it, so neither needs a download. Its functions
are plain enough that a mutation breaks a few tests, not all of them.
"""

from __future__ import annotations

import os
import textwrap

FILES = {
    "pyproject.toml": """
        [project]
        name = "minicalc"
        version = "0.1.0"
    """,
    "minicalc/__init__.py": """
        from minicalc.core import clamp, is_even, mean, running_total
        from minicalc.text import count_words, initials, pad_left
    """,
    "minicalc/core.py": """
        def clamp(x, lo, hi):
            \"\"\"x limited to [lo, hi].\"\"\"
            if x < lo:
                return lo
            if x > hi:
                return hi
            return x


        def is_even(n):
            return n % 2 == 0


        def mean(values):
            if not values:
                raise ValueError("mean of nothing")
            return sum(values) / len(values)


        def running_total(values):
            out, total = [], 0
            for v in values:
                total += v
                out.append(total)
            return out
    """,
    "minicalc/text.py": """
        def count_words(text):
            return len([w for w in text.split() if w])


        def initials(name):
            parts = name.split()
            return "".join(p[0].upper() for p in parts if p and p[0].isalpha())


        def pad_left(text, width, fill=" "):
            if len(text) >= width:
                return text
            return fill * (width - len(text)) + text
    """,
    "tests/test_core.py": """
        import pytest

        from minicalc import clamp, is_even, mean, running_total


        def test_clamp_inside():
            assert clamp(5, 0, 10) == 5


        def test_clamp_low():
            assert clamp(-3, 0, 10) == 0


        def test_clamp_high():
            assert clamp(42, 0, 10) == 10


        def test_is_even():
            assert is_even(4) and not is_even(7)


        def test_mean():
            assert mean([1, 2, 3, 6]) == 3


        def test_mean_empty():
            with pytest.raises(ValueError):
                mean([])


        def test_running_total():
            assert running_total([1, 2, 3]) == [1, 3, 6]
    """,
    "tests/test_text.py": """
        from minicalc import count_words, initials, pad_left


        def test_count_words():
            assert count_words("a bb  ccc") == 3


        def test_initials():
            assert initials("ada lovelace") == "AL"


        def test_pad_left():
            assert pad_left("7", 3, "0") == "007"


        def test_pad_left_long():
            assert pad_left("12345", 3) == "12345"
    """,
}


def write(dest: str) -> str:
    """Writes the package under ``dest`` (created) and returns ``dest``."""
    for rel, text in FILES.items():
        path = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(textwrap.dedent(text).lstrip("\n"))
    return dest
