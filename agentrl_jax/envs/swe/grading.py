"""Test-log parsing and the two verified rewards.

``resolved`` follows SWE-bench: 1 when every FAIL_TO_PASS and every PASS_TO_PASS test passes.
``verified_ratio`` is the fraction of FAIL_TO_PASS tests that pass, and 0 unless all PASS_TO_PASS
tests pass (partial credit that cannot be bought by breaking other tests). A log in which no test
status can be found is not evidence of failure by the agent: it scores 0 and is flagged
``infra_failure`` so that trainers can drop it instead of learning from it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence

PASSED, FAILED, ERROR, SKIPPED = "PASSED", "FAILED", "ERROR", "SKIPPED"
_PASSING = {PASSED, "XFAIL"}  # an expected failure counts as passing, as in SWE-bench
# `pytest -rA` summary lines: "PASSED tests/t.py::test_a", "FAILED tests/t.py::test_b - msg".
_SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS) (\S+?)(?: - (.*))?$")
# `pytest -v` lines: "tests/t.py::test_a PASSED  [ 50%]".
_VERBOSE = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")


def parse_pytest(log: str) -> dict[str, str]:
    """Maps pytest node ids to their status, from `-rA` summary lines and `-v` lines.

    Summary lines win over verbose ones (they come last and carry the final word, e.g. a test
    that passed its call but errored in teardown).
    """
    status: dict[str, str] = {}
    summary: dict[str, str] = {}
    for raw in log.splitlines():
        line = raw.rstrip()
        m = _SUMMARY.match(line)
        if m and "::" in m.group(2):
            summary[m.group(2)] = m.group(1)
            continue
        m = _VERBOSE.match(line)
        if m:
            status[m.group(1)] = m.group(2)
    status.update(summary)
    return status


def failure_messages(log: str) -> dict[str, str]:
    """The one-line error of each failing test, from `pytest -rA` summary lines."""
    out = {}
    for line in log.splitlines():
        m = _SUMMARY.match(line.rstrip())
        if m and m.group(1) in (FAILED, ERROR) and m.group(3):
            out[m.group(2)] = m.group(3)
    return out


LOG_PARSERS: dict[str, Callable[[str], dict[str, str]]] = {"pytest": parse_pytest}


@dataclasses.dataclass(frozen=True)
class Grade:
    """The verdict on one evaluation.

    Attributes:
      resolved: 1.0 when all FAIL_TO_PASS and PASS_TO_PASS pass, else 0.0.
      verified_ratio: passing fraction of FAIL_TO_PASS, 0.0 unless all PASS_TO_PASS pass.
      f2p_passed / p2p_failed: the test ids behind the numbers.
      infra_failure: the log shows no sign that tests ran (or the run could not happen).
      reason: a sentence for logs and for the agent.
    """

    resolved: float
    verified_ratio: float
    f2p_passed: tuple[str, ...] = ()
    p2p_failed: tuple[str, ...] = ()
    infra_failure: bool = False
    reason: str = ""

    def reward(self, kind: str) -> float:
        if kind == "resolved":
            return self.resolved
        if kind == "verified_ratio":
            return self.verified_ratio
        raise ValueError(f"reward kind {kind!r}: expected 'resolved' or 'verified_ratio'")


def failed_grade(reason: str, infra_failure: bool) -> Grade:
    """A zero grade with its reason (patch did not apply, test command missing, ...)."""
    return Grade(0.0, 0.0, infra_failure=infra_failure, reason=reason)


def grade(
    statuses: dict[str, str], fail_to_pass: Sequence[str], pass_to_pass: Sequence[str]
) -> Grade:
    """Scores parsed statuses against the task's test lists (a missing test counts as failing).

    Args:
      statuses: test id -> status word, from a LOG_PARSERS entry.
      fail_to_pass: tests the fix must make pass.
      pass_to_pass: tests that must keep passing.
    """
    if not statuses:
        return failed_grade("no test results in the log: the tests did not run", True)
    f2p_ok = tuple(t for t in fail_to_pass if statuses.get(t) in _PASSING)
    p2p_bad = tuple(t for t in pass_to_pass if statuses.get(t) not in _PASSING)
    all_p2p = not p2p_bad
    resolved = float(all_p2p and len(f2p_ok) == len(fail_to_pass))
    ratio = len(f2p_ok) / len(fail_to_pass) if fail_to_pass else float(all_p2p)
    ratio = ratio if all_p2p else 0.0
    reason = (
        f"{len(f2p_ok)}/{len(fail_to_pass)} FAIL_TO_PASS pass; "
        f"{len(pass_to_pass) - len(p2p_bad)}/{len(pass_to_pass)} PASS_TO_PASS pass"
    )
    return Grade(resolved, ratio, f2p_ok, p2p_bad, False, reason)
