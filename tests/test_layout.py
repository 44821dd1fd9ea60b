"""The package's shape: no import cycles (function-local imports included: a local import that dodges a
cycle is still a cycle), and leaves that import nothing of ours back."""
import ast
import pathlib

import workbench

PKG = pathlib.Path(workbench.__file__).parent


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the workbench modules it imports anywhere in its body (static, from the AST)."""
    files = {_module_name(p): p for p in PKG.rglob("*.py") if "notebooks" not in p.parts}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from workbench.x import y`: y is a module when workbench.x.y is one, else a name in x
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module
                           for a in node.names]
            else:
                continue
            graph[mod] |= {t for t in targets if t in files and t != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


LEAVES = {"workbench.errors", "workbench.measure.profiler", "workbench.measure.timing", "workbench.env.facts"}


def test_leaves_import_only_leaves():
    """The shared leaves (errors, the timing module and its profiler summary, env facts) stay leaves:
    anything may import them without a cycle growing later."""
    graph = import_graph()
    for leaf in LEAVES:
        assert graph[leaf] <= LEAVES, (leaf, graph[leaf] - LEAVES)
