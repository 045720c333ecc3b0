"""The project's own packages import each other without a circle.

Every module of the packages below is parsed (nothing is imported), and each import it
holds, at module level, inside a function or under ``TYPE_CHECKING``, is an edge to the
project module it names. A cycle in that graph fails the test, printed module by module.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("generator", "embed_runtime", "client", "bench")


def module_name(path: Path) -> str:
    """The dotted name of the module at ``path`` (a package is its ``__init__``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules(packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Every module of ``packages`` under the repository root, by dotted name."""
    return {
        module_name(path): path
        for package in packages
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def _base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` names before its imported names."""
    if node.level == 0:
        return node.module or ""
    parts = module.split(".")
    keep = len(parts) - node.level + (1 if is_package else 0)
    return ".".join([*parts[:keep], *([node.module] if node.module else [])])


def imported_modules(module: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``module`` (at ``path``) imports anywhere in its body."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, is_package, node)
            subs = {f"{base}.{alias.name}" for alias in node.names}
            found.update(subs & known)
            if subs - known:
                found.add(base)
    return (found & known) - {module}


def import_graph(packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Each module of ``packages`` with the project modules it imports."""
    modules = project_modules(packages)
    known = set(modules)
    return {name: imported_modules(name, path, known) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of ``graph`` that has more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(start: str) -> None:
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    components.append(component)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_in(graph, c) for c in components if len(c) > 1]


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A path that starts and ends at the first module of ``component``, inside it."""
    start = min(component)
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if child not in parents:
                    parents[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {start}")


def test_cycles_finds_a_circle_and_names_its_modules() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_imported_modules_resolves_relative_and_function_level_imports(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text(
        "from . import sibling\nfrom ..other import thing\n"
        "def f():\n    import pkg.deep\n    from .sibling import name\n"
    )
    known = {"pkg.sub.sibling", "pkg.other", "pkg.deep", "pkg.sub.mod"}
    assert imported_modules("pkg.sub.mod", source, known) == {
        "pkg.sub.sibling",
        "pkg.other",
        "pkg.deep",
    }


def test_project_packages_import_each_other_without_a_cycle() -> None:
    graph = import_graph()
    assert "generator.manifest" in graph
    found = cycles(graph)
    report = "\n".join(" -> ".join(cycle) for cycle in found)
    print(f"import cycles: {len(found)}" + (f"\n{report}" if report else ""))
    assert not found, f"{len(found)} import cycle(s):\n{report}"


def test_embed_runtime_subpackages_import_each_other_without_a_cycle() -> None:
    graph = import_graph(("embed_runtime",))
    assert {"embed_runtime.engines.contract", "embed_runtime.ops.probe"} <= set(graph)
    found = cycles(graph)
    assert not found, "\n".join(" -> ".join(cycle) for cycle in found)
    # The request path never reaches the manager's watch (stub watch, health probe).
    request_path = ("serving", "engines", "text", "image", "fetch")
    requests = {m for m in graph if m.count(".") > 1 and m.split(".")[1] in request_path}
    watch = {"embed_runtime.ops.probe", "embed_runtime.ops.stub_watch"}
    assert not {(m, d) for m in requests for d in graph[m] if d in watch}
