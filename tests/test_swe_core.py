"""SWE pieces that need no sandbox: task records, log parsing and grading, mutations, actions."""

import json

import pytest

from agentrl_jax.envs.swe import actions, grading, mutations
from agentrl_jax.envs.swe.runtime import filter_patch, is_protected, patch_files
from agentrl_jax.envs.swe.tasks import TaskFormatError, from_record, load_jsonl, write_jsonl

RECORD = {
    "instance_id": "o__r-1",
    "repo": "o/r",
    "base_commit": "abc",
    "problem_statement": "it breaks",
    "patch": "diff --git a/x.py b/x.py\n",
    "test_patch": "diff --git a/tests/test_x.py b/tests/test_x.py\n",
    "FAIL_TO_PASS": ["tests/test_x.py::test_a"],
    "PASS_TO_PASS": ["tests/test_x.py::test_b"],
}


# --- task records ----------------------------------------------------------------------------
def test_record_accepts_lists_and_json_strings():
    a = from_record(RECORD)
    b = from_record(
        {**RECORD, "FAIL_TO_PASS": json.dumps(RECORD["FAIL_TO_PASS"]), "PASS_TO_PASS": "[]"}
    )
    assert a.fail_to_pass == b.fail_to_pass == ("tests/test_x.py::test_a",)
    assert b.pass_to_pass == ()
    assert a.log_parser == "pytest" and a.source == "swe-gym" and a.test_cmd is None


def test_jsonl_roundtrip_and_relative_repo_path(tmp_path):
    t = from_record({**RECORD, "repo_path": str(tmp_path / "repos" / "r")})
    path = tmp_path / "tasks.jsonl"
    write_jsonl(str(path), [t], base_dir=str(tmp_path))
    assert json.loads(path.read_text())["repo_path"] == "repos/r"
    (back,) = load_jsonl(str(path))
    assert back == t


@pytest.mark.parametrize(
    "line, match",
    [
        ("{not json", r"tasks.jsonl:2: not valid JSON"),
        (json.dumps({k: v for k, v in RECORD.items() if k != "patch"}), r":2: missing .*'patch'"),
        (json.dumps({**RECORD, "FAIL_TO_PASS": "[oops"}), r"'FAIL_TO_PASS' is a string but not"),
        (json.dumps({**RECORD, "PASS_TO_PASS": [1]}), r"'PASS_TO_PASS' must be a list"),
        (json.dumps({**RECORD, "log_parser": "nose"}), r"'log_parser' is 'nose'"),
        (json.dumps(RECORD), r":2: duplicate instance_id 'o__r-1' \(first at line 1\)"),
        ("[1, 2]", r":2: expected a JSON object, got list"),
    ],
)
def test_malformed_jsonl_is_a_clear_error(tmp_path, line, match):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(RECORD) + "\n" + line + "\n")
    with pytest.raises(TaskFormatError, match=match):
        load_jsonl(str(path))


# --- log parsing and rewards -----------------------------------------------------------------
LOG = """\
============================= test session starts ==============================
tests/test_x.py::test_a PASSED                                           [ 33%]
tests/test_x.py::test_b FAILED                                           [ 66%]
=========================== short test summary info ============================
PASSED tests/test_x.py::test_a
PASSED tests/test_x.py::test_c[1-2]
FAILED tests/test_x.py::test_b - AssertionError: assert 1 == 2
ERROR tests/test_y.py::test_d - NameError: name 'q' is not defined
XFAIL tests/test_x.py::test_e - reason: known
========================= 1 failed, 2 passed in 0.10s =========================
"""


def test_parse_pytest_log():
    assert grading.parse_pytest(LOG) == {
        "tests/test_x.py::test_a": "PASSED",
        "tests/test_x.py::test_b": "FAILED",
        "tests/test_x.py::test_c[1-2]": "PASSED",
        "tests/test_y.py::test_d": "ERROR",
        "tests/test_x.py::test_e": "XFAIL",
    }
    assert grading.failure_messages(LOG) == {
        "tests/test_x.py::test_b": "AssertionError: assert 1 == 2",
        "tests/test_y.py::test_d": "NameError: name 'q' is not defined",
    }


def test_grade_semantics():
    st = grading.parse_pytest(LOG)
    a, b, c, d = (f"tests/test_x.py::test_{x}" for x in "abcd")
    c = "tests/test_x.py::test_c[1-2]"
    g = grading.grade(st, [a, c], [])
    assert (g.resolved, g.verified_ratio, g.infra_failure) == (1.0, 1.0, False)
    g = grading.grade(st, [a, b, c, "tests/test_x.py::missing"], [])
    assert (g.resolved, g.verified_ratio) == (0.0, 0.5)  # a missing test counts as failing
    g = grading.grade(st, [a], [b])  # a broken PASS_TO_PASS zeroes both rewards
    assert (g.resolved, g.verified_ratio, g.p2p_failed) == (0.0, 0.0, (b,))
    g = grading.grade(st, [a], ["tests/test_x.py::test_e"])  # XFAIL counts as passing
    assert g.resolved == 1.0


def test_log_without_tests_is_infra_failure():
    g = grading.grade(grading.parse_pytest("bash: pytest: command not found\n"), ["t::a"], [])
    assert g.infra_failure and g.resolved == 0.0 and g.verified_ratio == 0.0
    assert "did not run" in g.reason


# --- mutations -------------------------------------------------------------------------------
SRC = '''\
def f(a, b):
    """Docstring 123."""
    if a < b and a > 0:
        return a + 1
    total = a * b
    return total
'''


def test_mutations_cover_operators_and_change_behaviour():
    ms = mutations.find_mutations(SRC)
    ops = {m.op for m in ms}
    assert {"flip_compare", "swap_boolop", "off_by_one", "swap_arith", "negate_cond",
            "remove_stmt"} <= ops  # fmt: skip
    ref = {}
    exec(SRC, ref)
    changed = 0
    for m in ms:
        out = mutations.apply(SRC, m)
        assert out != SRC and "Docstring 123." in out  # docstrings are never mutated
        ns = {}
        exec(out, ns)
        probes = [(1, 2), (3, 2), (0, 5), (-1, 4), (2, 2)]
        results = []
        for args in probes:
            try:
                results.append(ns["f"](*args))
            except Exception as e:  # a mutation may make f raise: that is a behaviour change
                results.append(type(e))
        changed += results != [ref["f"](*a) for a in probes]
    assert changed >= len(ms) - 1  # `a > 0` -> `a > 1` is invisible on these probes at most


def test_mutation_is_a_minimal_text_edit():
    (m,) = [m for m in mutations.find_mutations(SRC) if m.op == "flip_compare" and m.col == 7]
    out = mutations.apply(SRC, m)
    diff = [(x, y) for x, y in zip(SRC.splitlines(), out.splitlines()) if x != y]
    assert diff == [("    if a < b and a > 0:", "    if a >= b and a > 0:")]


# --- actions ---------------------------------------------------------------------------------
def test_parse_actions():
    a = actions.parse_action("I will look.\n```bash\nls -la\necho hi\n```\nthen more")
    assert a == actions.Action("bash", (), "ls -la\necho hi")
    assert actions.parse_action("```view src/a.py 3 9\n```").args == ("src/a.py", "3", "9")
    assert actions.parse_action("```submit\n```").tool == "submit"
    a = actions.parse_action("```str_replace a.py\n<<<<<<< OLD\nx\n=======\ny\n>>>>>>> NEW\n```")
    assert a.tool == "str_replace" and a.args == ("a.py",)


@pytest.mark.parametrize(
    "text, match",
    [
        ("just talk", "no fenced action block"),
        ("```python\nprint(1)\n```", "unknown tool 'python'"),
        ("```bash\n\n```", "empty bash block"),
        ("```insert a.py\nx\n```", r"insert takes \(2, 2\) argument"),
        ("```view a.py x y\n```", "'x' is not a line number"),
        ("```submit now\n```", "submit takes no argument"),
    ],
)
def test_malformed_actions(text, match):
    with pytest.raises(actions.ActionError, match=match):
        actions.parse_action(text)


def test_truncate_keeps_head_and_tail():
    text = "".join(f"{i:05d}\n" for i in range(10000))
    out = actions.truncate(text, 1000)
    assert out.startswith("00000\n") and out.endswith("09999\n")
    assert f"[... {len(text) - 1000} characters elided ...]" in out
    assert actions.truncate("short", 1000) == "short"


class _MemRuntime:
    """An in-memory stand-in for a runtime's file access."""

    def __init__(self):
        self.files = {"a.py": "one\ntwo\nthree\n"}

    def read_file(self, p):
        if p not in self.files:
            raise FileNotFoundError(p)
        return self.files[p]

    def write_file(self, p, t):
        self.files[p] = t

    def exists(self, p):
        return p in self.files

    def is_dir(self, p):
        return False

    def remove_file(self, p):
        del self.files[p]


def test_file_editor_edits_and_undo():
    rt = _MemRuntime()
    ed = actions.FileEditor(rt)
    run = lambda text: ed.run(actions.parse_action(text))
    assert "     2\ttwo" in run("```view a.py\n```")
    run("```str_replace a.py\n<<<<<<< OLD\ntwo\n=======\nTWO\n>>>>>>> NEW\n```")
    assert rt.files["a.py"] == "one\nTWO\nthree\n"
    run("```insert a.py 0\nzero\n```")
    assert rt.files["a.py"] == "zero\none\nTWO\nthree\n"
    run("```create b.py\nprint(1)\n```")
    assert rt.files["b.py"] == "print(1)\n"
    with pytest.raises(actions.ActionError, match="found 0 times|not found"):
        run("```str_replace a.py\n<<<<<<< OLD\nnope\n=======\nx\n>>>>>>> NEW\n```")
    with pytest.raises(actions.ActionError, match="already exists"):
        run("```create a.py\nx\n```")
    run("```undo a.py\n```")
    run("```undo a.py\n```")
    assert rt.files["a.py"] == "one\ntwo\nthree\n"
    run("```undo b.py\n```")
    assert "b.py" not in rt.files
    with pytest.raises(actions.ActionError, match="no edit to undo"):
        run("```undo a.py\n```")


# --- patch protection ------------------------------------------------------------------------
def test_filter_patch_drops_test_files():
    patch = (
        "diff --git a/pkg/core.py b/pkg/core.py\n--- a/pkg/core.py\n+++ b/pkg/core.py\n@@ x\n"
        "diff --git a/tests/test_core.py b/tests/test_core.py\n@@ y\n"
        "diff --git a/conftest.py b/conftest.py\nnew file\n@@ z\n"
    )
    kept, dropped = filter_patch(patch)
    assert patch_files(kept) == ["pkg/core.py"]
    assert dropped == ("tests/test_core.py", "conftest.py")
    assert is_protected("pyproject.toml") and not is_protected("pkg/pyproject.toml")
    assert is_protected("pkg/util.py", frozenset({"pkg/util.py"}))
