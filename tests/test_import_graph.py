"""The architecture as a test: no import cycles, lower layers never import higher ones.

The graph is read statically (``ast``) from every ``import`` in the source, function-level lazy
imports included, so a cycle hidden behind a lazy import is still caught. docs/architecture.md
draws the same layers.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

PACKAGES = ("rlf_envs", "envs_registry", "rlf_trainer", "rlf_bench", "rlf_serve", "rlf_studio")

# rlf_envs, bottom to top. A module may import any lower layer, and within its own layer only its
# own component (e.g. rlf_envs.tools.* imports rlf_envs.tools.*, never rlf_envs.rewards.*). A
# component is a module or package; several names in one string make one component.
ENV_LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "base",
        (
            "rlf_envs.types",
            "rlf_envs.answers",
            "rlf_envs.runtime",
            "rlf_envs.spaces",
            "rlf_envs.llm_client",
            "rlf_envs.info_keys",
        ),
    ),
    (
        "services",
        ("rlf_envs.tools", "rlf_envs.rewards", "rlf_envs.servers", "rlf_envs.isolation", "rlf_envs.dialogue"),
    ),
    (
        "core",
        ("rlf_envs.task rlf_envs.episode rlf_envs.env_runtime rlf_envs.env rlf_envs.vector",),
    ),  # one component
    (
        "tasks",
        (
            "rlf_envs.tasks.tool_use",
            "rlf_envs.tasks.codebook",
            "rlf_envs.tasks.deepsearch",
            "rlf_envs.tasks.sql",
            "rlf_envs.tasks.python_tool",
            "rlf_envs.tasks.customer_service",
            "rlf_envs.tasks",
        ),
    ),  # fmt: skip
    ("registry", ("rlf_envs",)),  # the package itself: `import rlf_envs` registers the ids
    ("entry", ("rlf_envs.factories", "rlf_envs.demo", "rlf_envs.integrations")),
]

# Which top-level packages each package may import (besides itself).
ALLOWED_PACKAGES = {
    "envs_registry": set(),
    "rlf_envs": {"envs_registry"},
    "rlf_trainer": {"rlf_envs", "envs_registry"},
    "rlf_serve": {"rlf_trainer", "rlf_envs", "envs_registry"},
    "rlf_bench": {"rlf_trainer", "rlf_envs", "envs_registry"},
    "rlf_studio": {"rlf_trainer", "rlf_serve", "rlf_envs", "envs_registry"},
}


def _module_files() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _imported_names(module: str, path: Path) -> set[str]:
    names = set()
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (a name resolves to its longest known module)."""
    modules = _module_files()
    graph = {}
    for module, path in modules.items():
        targets = set()
        for name in _imported_names(module, path):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def env_layer(module: str) -> tuple[int, str]:
    """(layer number, component) of an rlf_envs module: the longest listed prefix wins."""
    best: tuple[int, str, int] | None = None
    for number, (_, components) in enumerate(ENV_LAYERS):
        for component in components:
            for prefix in component.split():
                inside = module == prefix or (prefix != "rlf_envs" and module.startswith(prefix + "."))
                if inside and (best is None or len(prefix) > best[2]):
                    best = (number, component, len(prefix))
    if best is None:
        raise AssertionError(
            f"{module} is in no layer of ENV_LAYERS: add it there and to docs/architecture.md"
        )
    return best[:2]


def test_no_import_cycles() -> None:
    assert _cycles(import_graph()) == []


def test_cycle_detection_finds_a_planted_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_env_layers_are_respected() -> None:
    violations = []
    for module, targets in import_graph().items():
        if not module.startswith("rlf_envs"):
            continue
        layer, component = env_layer(module)
        for target in targets:
            if not target.startswith("rlf_envs"):
                continue
            target_layer, target_component = env_layer(target)
            if target_layer > layer or (target_layer == layer and target_component != component):
                violations.append(
                    f"{module} ({ENV_LAYERS[layer][0]}) imports {target} ({ENV_LAYERS[target_layer][0]})"
                )
    assert violations == []


def test_layer_lookup_rejects_a_higher_import() -> None:
    assert env_layer("rlf_envs.tools.toolbox") == (1, "rlf_envs.tools")
    assert env_layer("rlf_envs.tasks.sql.server") == (3, "rlf_envs.tasks.sql")
    with pytest.raises(AssertionError, match="no layer"):
        env_layer("rlf_envs_extra.module")


def test_packages_import_only_what_they_may() -> None:
    violations = []
    for module, targets in import_graph().items():
        package = module.split(".")[0]
        for target in targets:
            other = target.split(".")[0]
            if other != package and other not in ALLOWED_PACKAGES[package]:
                violations.append(f"{module} imports {target}")
    assert violations == []


def test_import_rlf_envs_loads_no_trainer_stack() -> None:
    code = (
        "import sys, gymnasium as gym, rlf_envs\n"
        "for env_id in rlf_envs.ENV_IDS: gym.spec(env_id)\n"
        "heavy = ('torch', 'transformers', 'vllm', 'accelerate', 'trl', 'gradio', 'rlf_trainer', 'rlf_serve', 'rlf_bench')\n"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"
