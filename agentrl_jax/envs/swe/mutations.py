"""Bug injection by AST mutation, the way SWE-smith makes tasks from a clean repository.

``find_mutations(source)`` lists every site where one operator applies; ``apply`` rewrites only
that node's source span (so the gold patch is a one- or two-line diff, not a reformatted file)
and checks that the result still parses. Operators:

    flip_compare   a < b -> a >= b, == <-> !=, in <-> not in, is <-> is not
    swap_boolop    a and b <-> a or b
    off_by_one     integer literal n -> n + 1 / n - 1
    swap_arith     + <-> -, * <-> //, / <-> *, % -> //
    negate_cond    if c: -> if not (c):   (also while, ternary)
    remove_stmt    an assignment, augmented assignment or call statement -> pass
    swap_return_bool   return True <-> return False
"""

from __future__ import annotations

import ast
import dataclasses

OPERATORS = (
    "flip_compare",
    "swap_boolop",
    "off_by_one",
    "swap_arith",
    "negate_cond",
    "remove_stmt",
    "swap_return_bool",
)
_FLIP_CMP = {
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.Gt: ast.LtE,
    ast.LtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_SWAP_ARITH = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.FloorDiv: ast.Mult,
    ast.Div: ast.Mult,
    ast.Mod: ast.FloorDiv,
}


@dataclasses.dataclass(frozen=True)
class Mutation:
    """One applicable mutation: the operator, the node's span and the replacement text."""

    op: str
    lineno: int
    col: int
    end_lineno: int
    end_col: int
    replacement: str
    description: str

    @property
    def key(self) -> str:
        return f"{self.op}@{self.lineno}:{self.col}:{self.replacement}"


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _in_function(tree: ast.AST) -> set[int]:
    """ids of nodes inside a function body (module-level code runs at import: too loud)."""
    ids = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for stmt in fn.body:
                for node in ast.walk(stmt):
                    ids.add(id(node))
    return ids


def _candidates(node: ast.AST, docstrings: set[int]) -> list[tuple[str, ast.AST, str]]:
    """(op, node whose span is replaced, replacement source) for one node."""
    out = []
    if isinstance(node, ast.Compare) and type(node.ops[0]) in _FLIP_CMP:
        new = ast.Compare(
            node.left, [_FLIP_CMP[type(node.ops[0])](), *node.ops[1:]], node.comparators
        )
        out.append(("flip_compare", node, ast.unparse(new)))
    elif isinstance(node, ast.BoolOp):
        other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        out.append(("swap_boolop", node, ast.unparse(ast.BoolOp(other, node.values))))
    elif isinstance(node, ast.BinOp) and type(node.op) in _SWAP_ARITH:
        new = ast.BinOp(node.left, _SWAP_ARITH[type(node.op)](), node.right)
        out.append(("swap_arith", node, f"({ast.unparse(new)})"))
    elif (
        isinstance(node, ast.Constant)
        and type(node.value) is int
        and id(node) not in docstrings
        and abs(node.value) < 1000
    ):
        out.append(("off_by_one", node, str(node.value + 1)))
        if node.value > 0:
            out.append(("off_by_one", node, str(node.value - 1)))
    elif isinstance(node, ast.If | ast.While | ast.IfExp):
        out.append(("negate_cond", node.test, f"not ({ast.unparse(node.test)})"))
    elif isinstance(node, ast.Assign | ast.AugAssign) or (
        isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
    ):
        out.append(("remove_stmt", node, "pass"))
    elif (
        isinstance(node, ast.Return)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, bool)
    ):
        out.append(("swap_return_bool", node.value, str(not node.value.value)))
    return out


def find_mutations(source: str) -> list[Mutation]:
    """Every mutation that applies inside a function of ``source`` and yields valid Python.

    Raises:
      SyntaxError: ``source`` does not parse.
    """
    tree = ast.parse(source)
    docstrings, inside = _docstring_nodes(tree), _in_function(tree)
    found, seen = [], set()
    for node in ast.walk(tree):
        if id(node) not in inside:
            continue
        for op, target, text in _candidates(node, docstrings):
            m = Mutation(
                op=op,
                lineno=target.lineno,
                col=target.col_offset,
                end_lineno=target.end_lineno,
                end_col=target.end_col_offset,
                replacement=text,
                description=f"{op} at line {target.lineno}: {ast.unparse(target)!r:.60} -> "
                f"{text!r:.60}",
            )
            if m.key in seen:
                continue
            seen.add(m.key)
            try:
                mutated = apply(source, m)
            except SyntaxError:
                continue
            if mutated != source:
                found.append(m)
    found.sort(key=lambda m: (m.lineno, m.col, m.op, m.replacement))
    return found


def apply(source: str, m: Mutation) -> str:
    """``source`` with the span of ``m`` replaced by its text.

    Raises:
      SyntaxError: the mutated source does not parse.
    """
    lines = source.splitlines(keepends=True)
    # AST columns are UTF-8 byte offsets.
    first = lines[m.lineno - 1].encode("utf-8")
    last = lines[m.end_lineno - 1].encode("utf-8")
    prefix = first[: m.col].decode("utf-8")
    suffix = last[m.end_col :].decode("utf-8")
    new_lines = lines[: m.lineno - 1] + [prefix + m.replacement + suffix] + lines[m.end_lineno :]
    out = "".join(new_lines)
    ast.parse(out)
    return out
