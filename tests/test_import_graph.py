"""The packages import each other in one direction only (``ALLOWED``; an arrow points at
what a package may import):

    pallas_kernels, rwkv_torch_ref, scheduler  ->  rwkv7_core
    cpu_kernels  ->  rwkv7_core, pallas_kernels (the jnp references its kernels keep the contract of)
    rwkv_jax  ->  rwkv7_core, pallas_kernels, cpu_kernels
    rwkv7_apps  ->  all of the above

Every import statement of every module is read from its syntax tree (imports inside
functions, the lazy ones, included). A package may import only the packages listed for
it, and no package's modules may import each other in a circle.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {
    "rwkv7_core": set(),
    "pallas_kernels": {"rwkv7_core"},
    "rwkv_torch_ref": {"rwkv7_core"},
    "cpu_kernels": {"rwkv7_core", "pallas_kernels"},
    "rwkv_jax": {"rwkv7_core", "pallas_kernels", "cpu_kernels"},
    "scheduler": {"rwkv7_core"},
    "rwkv7_apps": {"rwkv7_core", "pallas_kernels", "cpu_kernels", "rwkv_torch_ref", "rwkv_jax", "scheduler"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Absolute names of the modules a file imports (relative imports resolved)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`
    return found


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in ALLOWED for p in (ROOT / pkg).rglob("*.py")}


def test_every_package_exists_and_parses():
    modules = project_modules()
    assert {m.split(".")[0] for m in modules} == set(ALLOWED)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_no_forbidden_package_import(package):
    bad = []
    for name, path in project_modules().items():
        if name.split(".")[0] != package:
            continue
        for target in imports_of(path):
            top = target.split(".")[0]
            if top in ALLOWED and top != package and top not in ALLOWED[package]:
                bad.append(f"{name} imports {target}")
    assert not bad, "\n".join(bad)


def test_no_module_import_cycle():
    modules = project_modules()
    graph = {name: {t for t in imports_of(path) if t in modules and t != name}
             for name, path in modules.items()}
    # A module imports its package's __init__ implicitly; that edge is not a cycle of code.
    graph = {name: {t for t in targets if not name.startswith(t + ".")} for name, targets in graph.items()}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_the_checker_sees_lazy_and_relative_imports(tmp_path):
    """The parser itself: a function-level import and a relative import are both found."""
    pkg = ROOT / "scheduler" / "core.py"
    assert "rwkv7_core.engine" in imports_of(pkg)
    assert "scheduler.prefill" in imports_of(pkg)
    assert "rwkv_jax" in imports_of(ROOT / "rwkv7_apps" / "engines.py")  # imported inside a function
