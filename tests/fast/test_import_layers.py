"""The layering, read from the code's own imports: the store knows nothing of the functions,
`functions/task/` is imported only by the CLI's pod steps, the shipped code imports nothing
of the tests or benches, the benches and the testbed nothing of the tests, and the modules
of `functions/` and `storage/` import each other without a cycle."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("functions", "storage", "bench", "testbed", "tests")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def imported(path: Path, *, top_level_only: bool) -> set[str]:
    """The project modules ``path`` imports: ``from a import b`` counts as ``a.b`` when that is
    a module (not the package ``a``, whose ``__init__`` merely re-exports). Imports under
    ``if TYPE_CHECKING:`` never run; with ``top_level_only`` a function's lazy import does
    not count either."""
    tree = ast.parse(path.read_text(), str(path))
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in modules() else base)
    return {m for m in found if m in modules() and m != name}


def importers_of(prefix: str) -> dict[str, set[str]]:
    return {
        name: {m for m in imported(path, top_level_only=False) if m.startswith(prefix)}
        for name, path in modules().items()
        if not name.startswith(prefix)
    }


def test_the_store_imports_nothing_of_the_functions() -> None:
    users = {n: m for n, m in importers_of("functions").items() if n.startswith("storage")}
    assert not any(users.values()), {n: m for n, m in users.items() if m}


def test_task_is_imported_only_by_the_pod_steps_and_their_tests() -> None:
    users = {n for n, m in importers_of("functions.task").items() if m}
    assert {n for n in users if not n.startswith("tests.")} == {"functions.cli.commands"}


def test_shipped_code_benches_and_testbed_import_nothing_of_the_tests() -> None:
    users = importers_of("tests")
    leaks = {n: m for n, m in users.items() if m and not n.startswith("tests")}
    assert leaks == {}
    shipped = {n: m for n, m in importers_of("bench").items() if m and not n.startswith("tests")}
    shipped |= {
        n: m
        for n, m in importers_of("testbed").items()
        if m and n.startswith(("functions", "storage"))
    }
    assert shipped == {}


def test_only_functions_kube_imports_kubernetes_and_it_imports_no_user_of_it() -> None:
    """Kubernetes access is in one package below every user of it (the runtimes, the
    credential provider, sender authentication, the Tekton controller)."""
    importers = set()
    for name, path in modules().items():
        if not name.startswith(PACKAGES[:2]):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            if any(n == "kubernetes" or n.startswith("kubernetes.") for n in names):
                importers.add(name)
    assert importers == {
        "functions.kube.api",
        "functions.kube.custom_objects",
        "functions.kube.tekton_api",
    }
    users = ("functions.runtimes", "functions.tekton", "functions.http", "functions.credentials")
    below = {
        name: {m for m in imported(path, top_level_only=False) if m.startswith(users)}
        for name, path in modules().items()
        if name.startswith("functions.kube")
    }
    assert not any(below.values()), below


def test_the_tekton_package_imports_no_internals_of_the_services_or_the_runtimes() -> None:
    """It shares the request parser (``functions.request_data``) and Kubernetes access
    (``functions.kube``) from below; it knows no service internals, Job or label."""
    inside = ("functions.service", "functions.runtimes")
    found = {
        name: {m for m in imported(path, top_level_only=False) if m.startswith(inside)}
        for name, path in modules().items()
        if name.startswith("functions.tekton")
    }
    assert not any(found.values()), {n: m for n, m in found.items() if m}


def test_the_shipped_modules_import_each_other_without_a_cycle() -> None:
    graph = {
        name: {m for m in imported(path, top_level_only=True) if m.startswith(PACKAGES[:2])}
        for name, path in modules().items()
        if name.startswith(PACKAGES[:2])
    }
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, " -> ".join([*path[path.index(name) :], name])
        if name in done:
            return
        for target in sorted(graph[name]):
            visit(target, (*path, name))
        done.add(name)

    for name in sorted(graph):
        visit(name, ())
    assert len(done) == len(graph) > 50


def test_no_module_name_is_used_twice_in_shipped_code() -> None:
    """``functions.errors`` and ``storage.errors`` read alike in a traceback: each module name
    of the shipped packages says one thing."""
    names: dict[str, list[str]] = {}
    for name in modules():
        if name.startswith(PACKAGES[:2]) and modules()[name].name != "__init__.py":
            names.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    assert {short: full for short, full in names.items() if len(full) > 1} == {}
