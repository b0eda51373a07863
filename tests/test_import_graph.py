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
            "rlf_envs.loop_thread",
            "rlf_envs.spaces",
            "rlf_envs.llm_client",
            "rlf_envs.info_keys",
            "rlf_envs.ports",
        ),
    ),
    (
        "services",
        ("rlf_envs.tools", "rlf_envs.rewards", "rlf_envs.servers", "rlf_envs.isolation", "rlf_envs.dialogue"),
    ),
    ("core", ("rlf_envs.core",)),  # the contract: task, episode, env runtime, env, vector env
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

# rlf_trainer, bottom to top, by the same rules. docs/architecture.md says why each folder sits where it does.
TRAINER_LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "base",
        (
            "rlf_trainer.names rlf_trainer.seeds rlf_trainer.prompts rlf_trainer.config_sections rlf_trainer.config_errors rlf_trainer.config",
        ),
    ),
    ("engines", ("rlf_trainer.run", "rlf_trainer.policy")),  # processes and generators, unaware of each other
    ("rollout", ("rlf_trainer.rollout",)),
    ("observe", ("rlf_trainer.observe",)),
    ("learning", ("rlf_trainer.algorithms", "rlf_trainer.data")),
    (
        "assembly",
        ("rlf_trainer rlf_trainer.build rlf_trainer.trainer rlf_trainer.cli rlf_trainer.eval_cli",),
    ),
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


def layer_of(module: str, layers: list[tuple[str, tuple[str, ...]]] = ENV_LAYERS) -> tuple[int, str]:
    """(layer number, component) of a module in ``layers``: the longest listed prefix wins."""
    best: tuple[int, str, int] | None = None
    for number, (_, components) in enumerate(layers):
        for component in components:
            for prefix in component.split():
                is_package_root = "." not in prefix  # `rlf_envs` alone is the package's own __init__
                inside = module == prefix or (not is_package_root and module.startswith(prefix + "."))
                if inside and (best is None or len(prefix) > best[2]):
                    best = (number, component, len(prefix))
    if best is None:
        raise AssertionError(f"{module} is in no layer: add it to the layers and to docs/architecture.md")
    return best[:2]


def test_no_import_cycles() -> None:
    assert _cycles(import_graph()) == []


def test_cycle_detection_finds_a_planted_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def layer_violations(package: str, layers: list[tuple[str, tuple[str, ...]]]) -> list[str]:
    """Imports inside ``package`` that reach a higher layer or another component of the same layer."""
    violations = []
    for module, targets in import_graph().items():
        if module.split(".")[0] != package:
            continue
        layer, component = layer_of(module, layers)
        for target in targets:
            if target.split(".")[0] != package:
                continue
            target_layer, target_component = layer_of(target, layers)
            if target_layer > layer or (target_layer == layer and target_component != component):
                violations.append(
                    f"{module} ({layers[layer][0]}) imports {target} ({layers[target_layer][0]})"
                )
    return violations


@pytest.mark.parametrize("package, layers", [("rlf_envs", ENV_LAYERS), ("rlf_trainer", TRAINER_LAYERS)])
def test_layers_are_respected(package: str, layers: list[tuple[str, tuple[str, ...]]]) -> None:
    assert layer_violations(package, layers) == []


def test_layer_lookup_rejects_a_higher_import() -> None:
    assert layer_of("rlf_envs.tools.toolbox") == (1, "rlf_envs.tools")
    assert layer_of("rlf_envs.tasks.sql.server") == (3, "rlf_envs.tasks.sql")
    assert layer_of("rlf_trainer.algorithms.grpo", TRAINER_LAYERS) == (4, "rlf_trainer.algorithms")
    assert layer_of("rlf_trainer", TRAINER_LAYERS)[0] == 5
    with pytest.raises(AssertionError, match="no layer"):
        layer_of("rlf_envs_extra.module")


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
