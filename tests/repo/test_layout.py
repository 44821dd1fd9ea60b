"""The package's shape: no import cycles (function-local imports included: a local import that dodges a
cycle is still a cycle), no knot between its sub-packages, leaves that import nothing of ours back, the
configuration a leaf, every dynamic import named with its reason, the layers read bottom-up, and modules
and functions of a size a reader can hold."""
import ast
import pathlib

import workbench

PKG = pathlib.Path(workbench.__file__).parent


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def package_files() -> dict[str, pathlib.Path]:
    """{module name: its file} of every module of the package (the shipped notebooks are not modules)."""
    return {_module_name(p): p for p in PKG.rglob("*.py") if "notebooks" not in p.parts}


def _absolute(mod: str, path: pathlib.Path, node: ast.ImportFrom) -> str:
    """The module a `from ... import` names, relative ones (`from . import x`) resolved against `mod`."""
    if not node.level:
        return node.module or ""
    package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> dict[str, set[str]]:
    """module -> the workbench modules it imports anywhere in its body (static, from the AST)."""
    files = package_files()
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                # `from workbench.x import y`: y is a module when workbench.x.y is one, else a name in x
                source = _absolute(mod, path, node)
                targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in files else source for a in node.names]
            else:
                continue
            graph[mod] |= {t for t in targets if t in files and t != mod}
    return graph


def package_graph(graph: dict[str, set[str]], root: str = PKG.name) -> dict[str, set[str]]:
    """The module graph folded to the package's parts: root.X for each sub-package or top module
    (workbench.config.fields -> workbench.config). The package's own __init__ is left out: it is the
    parts' common parent, not one of them."""
    def part(m: str) -> str:
        return ".".join(m.split(".")[:2])

    out: dict[str, set[str]] = {}
    for mod, targets in graph.items():
        if mod != root:
            out.setdefault(part(mod), set()).update(part(t) for t in targets if t != root and part(t) != part(mod))
    return out


def test_relative_imports_are_resolved():
    def target(mod, file, line):
        return _absolute(mod, pathlib.Path(file), ast.parse(line).body[0])

    assert target("workbench.config.root", "root.py", "from . import checks") == "workbench.config"
    assert target("workbench.config", "__init__.py", "from .fields import X") == "workbench.config.fields"
    assert target("workbench.run.runner", "runner.py", "from ..config import Config") == "workbench.config"


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


LEAVES = {"workbench.measure.profiler", "workbench.measure.timing", "workbench.env.facts"}


def test_leaves_import_only_leaves():
    """The shared leaves (the configuration, the timing module and its profiler summary, env facts) stay
    leaves: anything may import them without a cycle growing later."""
    graph = import_graph()
    config = {m for m in graph if _inside(m, CONFIG)}
    for leaf in LEAVES:
        assert graph[leaf] <= LEAVES | config, (leaf, graph[leaf] - LEAVES - config)


# ---- the configuration is a leaf -------------------------------------------------------------
CONFIG = "workbench.config"


def _inside(mod: str, package: str) -> bool:
    return mod == package or mod.startswith(package + ".")


def outside_imports(graph: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """{module of `package`: what it imports from outside `package`}, for the modules that do."""
    return {m: out for m, targets in graph.items() if _inside(m, package)
            if (out := {t for t in targets if not _inside(t, package)})}


def test_the_leaf_check_finds_an_import_out_of_the_package():
    graph = {"wb.config": {"wb.config.fields"}, "wb.config.fields": {"wb.backends"}, "wb.backends": {"wb.config"}}
    assert outside_imports(graph, "wb.config") == {"wb.config.fields": {"wb.backends"}}
    assert outside_imports({"wb.config": {"wb.config.fields"}, "wb.config.fields": set()}, "wb.config") == {}


def test_the_configuration_imports_nothing_of_the_package():
    """workbench.config and its modules import nothing else of workbench, not even in a function body
    (which backends exist is the registry's knowledge: the run asks it, backends.check_specs)."""
    graph = import_graph()
    assert CONFIG in graph and any(m.startswith(CONFIG + ".") for m in graph)
    assert outside_imports(graph, CONFIG) == {}


# ---- no knot between the sub-packages --------------------------------------------------------
def test_the_package_graph_folds_modules_into_their_parts():
    graph = {"wb": {"wb.a"}, "wb.a": set(), "wb.a.x": {"wb.b.y"}, "wb.a.w": set(), "wb.b.y": set(),
             "wb.b.z": {"wb.a.w", "wb.c"}, "wb.c": set()}
    assert cycles(graph) == []  # no module imports itself back ...
    folded = package_graph(graph, root="wb")
    assert folded == {"wb.a": {"wb.b"}, "wb.b": {"wb.a", "wb.c"}, "wb.c": set()}
    assert cycles(folded) == [["wb.a", "wb.b"]]  # ... but the parts a and b form a knot


def test_no_knot_between_sub_packages():
    """The layers read bottom-up (config -> results -> data, env -> models -> backends -> measure -> train ->
    run -> drivers): a part that imports a module of another which imports one of it back is a knot,
    even when no single module cycle exists."""
    assert cycles(package_graph(import_graph())) == []


# ---- dynamic imports are declared -----------------------------------------------------------
DYNAMIC_IMPORTS = {  # file (relative to the package) -> (dynamic import calls in it, why)
    "cli.py": (1, ("imports only the chosen command's module, so an optional module's dependencies cannot "
                   "break the other commands")),
    "backends/__init__.py": (1, "discovers the backend files of its folder: a backend is one file"),
    "backends/hf_families/__init__.py": (1, "discovers the family files of its folder: a Hugging Face family is one "
                                            "file"),
    "models/kinds/__init__.py": (1, "discovers the kind files of its folder: a model kind is one file"),
    "train/teacher_targets/__init__.py": (1, "discovers the mode files of its folder: a teacher mode is one file"),
}


def dynamic_imports(source: str) -> int:
    """How many calls in `source` import a module by a name computed at run time: importlib.import_module
    (also imported by name, under any alias) and __import__ (a static import graph cannot see them)."""
    tree = ast.parse(source)
    names = {"__import__"} | {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                              and node.module == "importlib" for a in node.names if a.name == "import_module"}
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            count += (isinstance(f, ast.Attribute) and f.attr == "import_module") or (isinstance(f, ast.Name)
                                                                                      and f.id in names)
    return count


def test_the_dynamic_import_counter_sees_hidden_imports():
    assert dynamic_imports("import importlib\nimportlib.import_module('workbench.backends')") == 1
    assert dynamic_imports("from importlib import import_module as load\ndef f():\n    load('workbench.run')") == 1
    assert dynamic_imports("def f():\n    return __import__('workbench.' + 'run')") == 1
    assert dynamic_imports("import importlib.util\nimportlib.util.find_spec('te')\ndef load(x): pass\nload(1)") == 0


def test_every_dynamic_import_is_declared():
    """A dynamic import is an arrow the import graph above cannot see; each is listed with its reason."""
    found = {p.relative_to(PKG).as_posix(): n for mod, p in package_files().items()
             if (n := dynamic_imports(p.read_text()))}
    assert found == {f: n for f, (n, _) in DYNAMIC_IMPORTS.items()}


# ---- the layers read bottom-up ---------------------------------------------------------------
LAYERS = [  # bottom-up; a part may import its own layer's peers and any layer below, never one above
    {"config"}, {"results"}, {"data", "env"}, {"models"}, {"backends"}, {"measure"}, {"train"},
    {"jax_side"},  # the JAX/Flax comparator row: its own student and step, the timing module's statistics
    {"run"},
    {"notebook"},  # executes the notebooks: the `notebook` command, and the sweep's and the study's points
    {"bench", "sweep", "study", "teacher", "verdict"}, {"panel", "cli", "__main__", "lab"},
]


def arrows_up(folded: dict[str, set[str]], layers: list[set[str]], root: str = PKG.name) -> list[tuple[str, str]]:
    """(part, what it imports) for each import of a part in a higher layer than its own."""
    floor = {f"{root}.{name}": i for i, layer in enumerate(layers) for name in layer}
    return sorted((p, t) for p, targets in folded.items() for t in targets if floor[t] > floor[p])


def test_the_layer_check_finds_an_arrow_up():
    folded = {"wb.models": {"wb.train"}, "wb.train": {"wb.models"}, "wb.data": set()}
    assert arrows_up(folded, [{"data"}, {"models"}, {"train"}], root="wb") == [("wb.models", "wb.train")]
    assert arrows_up({"wb.train": {"wb.models", "wb.data"}}, [{"data"}, {"models"}, {"train"}], root="wb") == []


def test_no_arrow_runs_up_the_layers():
    folded = package_graph(import_graph())
    assert set(folded) == {f"{PKG.name}.{name}" for layer in LAYERS for name in layer}  # every part has a layer
    assert arrows_up(folded, LAYERS) == []


# ---- sizes a reader can hold -----------------------------------------------------------------
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60


def long_modules(files: dict[str, pathlib.Path], limit: int = MAX_MODULE_LINES) -> dict[str, int]:
    return {m: n for m, p in files.items() if (n := len(p.read_text().splitlines())) > limit}


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """{name: lines} of each function (methods and nested ones too) longer than `limit`, def to its last line
    (docstring included, decorators not)."""
    return {node.name: n for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            if (n := node.end_lineno - node.lineno + 1) > limit}


def test_the_size_checks_find_a_long_module_and_a_long_function(tmp_path):
    long, short = tmp_path / "long.py", tmp_path / "short.py"
    long.write_text("x = 1\n" * 401)
    short.write_text("x = 1\n" * 400)
    assert long_modules({"long": long, "short": short}) == {"long": 401}
    body = "".join(f"    y{i} = {i}\n" for i in range(60))
    source = f"def long():\n{body}\nclass A:\n    def short(self):\n        return 1\n"
    assert long_functions(source) == {"long": 61}
    assert long_functions(f"def ok():\n{body[:-len('    y59 = 59')-1]}") == {}


def test_no_module_is_too_long_to_read():
    assert long_modules(package_files()) == {}


def test_no_function_is_too_long_to_read():
    found = {f"{m}.{name}": n for m, p in package_files().items() for name, n in long_functions(p.read_text()).items()}
    assert found == {}


# ---- architectures are declared, not compared by name ----------------------------------------
KIND_NAME_RULES = {  # file (relative to the package) -> functions that may compare a `kind` with a name, and why
    "config/checks.py": ({"kind_task"}, "the configuration, a leaf, cannot ask the kinds registry which task a "
                                        "kind has: the one rule the registry enforces is stated there once"),
}
DECLARED_FILES = ("models/lm.py", "models/kinds/__init__.py", "config/*.py")


def kind_name_compares(source: str) -> list[str]:
    """The function (or '<module>') of each ==, !=, in or not in whose operand is a `kind` (a name or an
    attribute: kind, shape.kind, cfg.model.kind), where code would branch on a kind's name."""
    def is_kind(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id == "kind") or (isinstance(node, ast.Attribute)
                                                                      and node.attr == "kind")

    found = []

    def visit(node: ast.AST, where: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            where = node.name
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                 for op in node.ops):
            if any(is_kind(n) for n in (node.left, *node.comparators)):
                found.append(where)
        for child in ast.iter_child_nodes(node):
            visit(child, where)

    visit(ast.parse(source), "<module>")
    return found


def test_the_kind_compare_finder_finds_a_compare_of_a_kind_name():
    source = ("def f(shape):\n    return shape.kind == 'llama'\n"
              "def g(cfg):\n    return 'x' if cfg.model.kind in ('gpt', 'llama') else 'y'\n"
              "def h(kind, arch):\n    return arch.norm == 'rmsnorm' and kind.task == 'lm'\n"
              "x = kind != 'mlp'\n")
    assert kind_name_compares(source) == ["f", "g", "<module>"]


def test_the_model_code_and_the_configuration_read_declarations_not_kind_names():
    """workbench/models/lm.py builds from the kind's `Arch`, the configuration checks a kind by its task:
    neither compares model.kind with a name (one declared exception, with its reason)."""
    files = sorted({p for pattern in DECLARED_FILES for p in PKG.glob(pattern)})
    assert len(files) > 3
    found = {p.relative_to(PKG).as_posix(): set(where) for p in files if (where := kind_name_compares(p.read_text()))}
    assert found == {f: names for f, (names, _) in KIND_NAME_RULES.items()}


# ---- a student is a value ---------------------------------------------------------------------------
BACKEND_MEMBERS_MAX = 13  # declarations (framework: who trains the student) + availability, convert, prepare
# (+ fallback, __init__)


def state_writes(source: str) -> list[str]:
    """'function: self.attr' for every assignment to an attribute of `self` outside `__init__`: state a method
    writes onto its object (what a backend's student held before it was a value, `backends.Student`)."""
    found = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or fn.name == "__init__":
            continue
        for node in ast.walk(fn):
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            for t in targets:
                for leaf in (t.elts if isinstance(t, ast.Tuple) else [t]):
                    if isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name) and leaf.value.id == "self":
                        found.append(f"{fn.name}: self.{leaf.attr}")
    return found


def class_members(source: str, name: str) -> list[str]:
    """The names a class's own body declares: its methods and class attributes (inherited ones not counted)."""
    cls = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == name)
    out = []
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append(node.name)
        elif isinstance(node, ast.Assign):
            out += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.append(node.target.id)
    return out


def test_the_state_and_member_checks_find_what_they_look_for():
    src = ("class B:\n    x = 1\n    y: int = 2\n    def __init__(self):\n        self.a = 1\n"
           "    def build(self):\n        self.b, self.c = 1, 2\n        self.d += 1\n        other.e = 3\n")
    assert state_writes(src) == ["build: self.b", "build: self.c", "build: self.d"]
    assert class_members(src, "B") == ["x", "y", "__init__", "build"]


def test_no_backend_writes_state_outside_init():
    """A backend keeps its declarations; what it prepares for a student is in the `Student` it returns."""
    found = {str(p.relative_to(PKG)): w for p in (PKG / "backends").rglob("*.py") if (w := state_writes(p.read_text()))}
    assert not found


def test_the_backend_type_is_a_dozen_members_or_fewer():
    members = class_members((PKG / "backends" / "__init__.py").read_text(), "Backend")
    assert len(members) <= BACKEND_MEMBERS_MAX, members


def test_train_imports_no_private_backend_module():
    """The trainer and the teacher code take a prepared `Student` and the backends' public functions; a backend's
    private helpers ('_te', '_gemm', '_autocast') may change with it."""
    found = {m: sorted(t for t in targets if t.startswith("workbench.backends._"))
             for m, targets in import_graph().items() if _inside(m, "workbench.train")}
    assert not {m: t for m, t in found.items() if t}


# ---- train/: config objects, not rows of scalars; teacher modes are declarations ---------------------------
MAX_PARAMETERS = 7  # a function that needs more wants its config object (cfg.distill, not eleven scalars)


def many_parameters(source: str, limit: int = MAX_PARAMETERS) -> dict[str, int]:
    """{name: parameters} of each function (methods and nested ones too) declaring more than `limit`
    parameters: positional, keyword-only, *args and **kwargs, a method's self or cls not counted."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x is not None]
            n = len(names) - (names[:1] in (["self"], ["cls"]))
            if n > limit:
                found[node.name] = n
    return found


def test_the_parameter_count_finds_a_long_signature():
    assert many_parameters("def f(a, b, c, d, e, f, g, *h):\n    pass") == {"f": 8}
    assert many_parameters("class A:\n    def m(self, a, b, c, d, e, f, g):\n        pass") == {}
    assert many_parameters("def f(a, b, c, d, e, f, *, g=1, **kw):\n    pass") == {"f": 8}


def test_no_function_in_train_takes_more_than_seven_parameters():
    found = {f"{m}.{name}": n for m, p in package_files().items() if m.startswith(f"{PKG.name}.train.")
             for name, n in many_parameters(p.read_text()).items()}
    assert found == {}


TEACHER_MODES = ("precomputed", "online", "topk")
MODE_REGISTRY = f"{PKG.name}.train.teacher_targets"


def mode_name_compares(source: str, names: tuple[str, ...] = TEACHER_MODES) -> list[int]:
    """Lines comparing something with a teacher mode's name (==, !=, in, not in; a tuple, list or set of names
    too): the code asking for a mode's declared property by its name."""
    def named(node) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(named(e) for e in node.elts)

    return sorted(node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Compare)
                  and any(named(x) for x in (node.left, *node.comparators)))


def test_the_mode_compare_finder_finds_a_compare_of_a_mode_name():
    assert mode_name_compares('if mode == "topk":\n    pass\nx = m in ("online", "other")') == [1, 3]
    assert mode_name_compares('x = {"topk": 1}["topk"]\nok = mode.topk\nname = "online"') == []


def test_teacher_modes_are_compared_by_name_nowhere_outside_their_registry():
    """A new teacher mode is one file in train/teacher_targets/: nothing else branches on a mode's name."""
    found = {m: lines for m, p in package_files().items() if not m.startswith(MODE_REGISTRY)
             if (lines := mode_name_compares(p.read_text()))}
    assert found == {}


def test_train_is_sorted_by_concern():
    """train/ keeps the loop and its tasks at its top (about six files); objectives, teacher targets and the
    teacher live in their own folders, so a new loss or teacher mode does not widen the corridor."""
    top = sorted(p.name for p in (PKG / "train").glob("*.py"))
    assert len(top) <= 6, top
    assert {"objectives", "teacher_targets", "teacher"} <= {p.name for p in (PKG / "train").iterdir() if p.is_dir()}
