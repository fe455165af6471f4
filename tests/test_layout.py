"""The shape of the house: core layers without cycles, module sizes, the public surface
plugins import (and its one document), and a core that names no ONNX op. (The built-in
families' layout is checked in test_registry.py.)

Everything here reads source with the AST; nothing is imported or run.
"""

from __future__ import annotations

import ast
import pathlib
from fnmatch import fnmatch

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORE = ROOT / "core"
BUILTINS = ROOT / "builtin_ops"

#: The core's dependency order, lowest first. A module may import (at module level or
#: inside a function) only modules of its own layer or a lower one, and the imports among
#: modules of one layer must not form a cycle. Every core module is named here.
LAYERS = (
    ("foundation", ("plugrt", "plugrt.errors", "plugrt.device", "plugrt.files", "plugrt.paths")),
    ("data", ("plugrt.ir", "plugrt.ir.dims", "plugrt.ir.tensor", "plugrt.ir.graph", "plugrt.tactic")),
    ("kernel toolkit", ("plugrt.kernels", "plugrt.inline_ptx", "plugrt.kernel_cache", "plugrt.binaries", "plugrt.launcher", "plugrt.fusion", "plugrt.fusion.codegen")),
    ("plugin contract", ("plugrt.plugin", "plugrt.hookspecs")),
    ("graph analysis", ("plugrt.ir.attributes", "plugrt.ir.infer", "plugrt.ir.validate", "plugrt.ir.specialize", "plugrt.bindings",
                        "plugrt.fusion.op")),
    ("registry", ("plugrt.registry", "plugrt.reference")),
    ("import and passes", ("plugrt.onnx", "plugrt.onnx.checks", "plugrt.onnx.conditionals", "plugrt.onnx.functions",
                           "plugrt.onnx.importer", "plugrt.passes",
                           "plugrt.passes.*")),
    ("tuning", ("plugrt.tuning", "plugrt.tuning.*")),
    ("engine", ("plugrt.quantization", "plugrt.quantization.*", "plugrt.engine", "plugrt.engine.*", "plugrt.bench", "plugrt.layer_profile")),
    ("tools", ("plugrt.onnx.backend", "plugrt.testing", "plugrt.testing.*", "plugrt.testing_pytest",
               "plugrt.scaffold", "plugrt.onnxruntime_compare", "plugrt.serving", "plugrt.serving.*",
               "plugrt.cli_options", "plugrt.cli_bench", "plugrt.cli_serve", "plugrt.cli",
               "plugrt.__main__")),
)

#: What a plugin may import from plugrt: the public surface (documented in docs/PLUGIN_API.md).
PUBLIC_MODULES = ("plugrt", "plugrt.plugin", "plugrt.kernels", "plugrt.passes.pattern", "plugrt.testing")

#: Modules over the size limit, and why (kernel factories whose one kernel is long).
SIZE_LIMIT = 450
LONG_MODULES: dict[str, str] = {}


def module_name(path: pathlib.Path, root: pathlib.Path, package: str) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([package] + parts)


def core_modules() -> dict[str, pathlib.Path]:
    return {module_name(p, CORE, "plugrt"): p for p in CORE.rglob("*.py")}


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (imports for annotations only)."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                skipped.update(id(n) for n in ast.walk(inner))
    return skipped


def imports_of(module: str, path: pathlib.Path) -> list[tuple[str, int]]:
    """``(imported module, line)`` for every import in ``path``, module level or not."""
    tree = ast.parse(path.read_text())
    skipped = _type_checking_blocks(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found.append((base, node.lineno))
            found += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return found


def core_edges() -> dict[str, set[tuple[str, int]]]:
    """Module -> the core modules it makes Python import, parent packages included (importing
    ``a.b.c`` runs ``a.b``'s ``__init__`` too, unless the importer is inside ``a.b``)."""
    modules = core_modules()
    edges: dict[str, set[tuple[str, int]]] = {m: set() for m in modules}
    for module, path in modules.items():
        for target, line in imports_of(module, path):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if not target or target == module:
                continue
            parts = target.split(".")
            for depth in range(1, len(parts) + 1):
                ancestor = ".".join(parts[:depth])
                if ancestor in modules and ancestor != module and not module.startswith(ancestor + "."):
                    edges[module].add((ancestor, line))
    return edges


def layer_of(module: str) -> int:
    for index, (_, patterns) in enumerate(LAYERS):
        if any(fnmatch(module, pattern) for pattern in patterns):
            return index
    raise AssertionError(f"core module {module} is in no layer of LAYERS; add it where it belongs")


def test_every_core_module_has_a_layer():
    for module in core_modules():
        layer_of(module)


def test_core_imports_only_downward():
    upward = []
    for module, targets in core_edges().items():
        for target, line in sorted(targets):
            if layer_of(target) > layer_of(module):
                upward.append(f"{module}:{line} imports {target} ({LAYERS[layer_of(module)][0]} -> "
                              f"{LAYERS[layer_of(target)][0]})")
    assert not upward, "imports against the core's dependency order:\n" + "\n".join(upward)


def test_core_has_no_import_cycle():
    edges = {m: {t for t, _ in targets} for m, targets in core_edges().items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        stack.append(module)
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                return stack[stack.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        stack.pop()
        state[module] = 2
        return None

    for module in sorted(edges):
        if module not in state:
            cycle = visit(module)
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_sees_function_level_imports(tmp_path):
    source = "def f():\n    from plugrt.engine import builder\n"
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert ("plugrt.engine", 2) in imports_of("plugrt.probe", path)


@pytest.mark.parametrize("root", [CORE, BUILTINS], ids=["core", "builtin_ops"])
def test_module_sizes(root):
    over = []
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        name = str(path.relative_to(ROOT))
        if lines > SIZE_LIMIT and name not in LONG_MODULES:
            over.append(f"{name}: {lines} lines")
    assert not over, f"modules over {SIZE_LIMIT} lines (split them): " + ", ".join(over)


def _plugin_sources():
    roots = [BUILTINS, *(ROOT / "contrib_plugins").glob("*/plugrt_*")]
    return [p for root in roots for p in root.rglob("*.py")]


def test_plugins_import_only_the_public_surface():
    private = []
    for path in _plugin_sources():
        for target, line in imports_of("plugin.module", path):
            if target.split(".")[0] != "plugrt":
                continue
            parent = target.rpartition(".")[0]
            if target in PUBLIC_MODULES or parent in PUBLIC_MODULES:
                continue
            private.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not private, ("plugins must import only " + ", ".join(PUBLIC_MODULES) + ":\n" + "\n".join(private))


def test_public_modules_declare_their_surface():
    for module in PUBLIC_MODULES:
        path = core_modules()[module]
        tree = ast.parse(path.read_text())
        declared = [n for n in tree.body if isinstance(n, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)]
        assert declared, f"{module} ({path.relative_to(ROOT)}) declares no __all__"


def test_core_names_no_onnx_op():
    from plugrt.registry import Registry

    ops = {op.op_type for op in Registry.load(autoload=False).ops() if op.domain in ("", "ai.onnx")}
    named = []
    for path in CORE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in ops:
                named.append(f"{path.relative_to(ROOT)}:{node.lineno} names {node.value!r}")
    assert not named, "the core must not name ONNX ops (the plugins' hooks say what it needs):\n" + "\n".join(named)


def test_the_public_surface_is_documented_in_one_place():
    import importlib

    doc = (ROOT / "docs" / "PLUGIN_API.md").read_text()
    missing = []
    for module in PUBLIC_MODULES:
        names = importlib.import_module(module).__all__
        missing += [f"{module}.{name}" for name in names if f"`{name}`" not in doc and f"`{name}(" not in doc]
    assert not missing, "docs/PLUGIN_API.md does not name: " + ", ".join(missing)
