"""Fixtures shared by several test files; pytest finds them by name, nothing to import.

Shared *helpers* (functions, classes, constants: ``REPO``, ``free_local_port``, ``http_server``,
``OpenAITestServer``, ``rlf_serve``, ``tiny_config``, ...) live in ``tests/helpers.py``: import them
from there, never from another ``test_*.py`` file. The fixture servers (``tests/mcp_fixtures/*_server.py``)
are real MCP servers that the tests run as subprocesses.

Fixtures here:

- ``tiny_model_dir`` (session), ``tiny_tokenizer`` (session), ``tiny_model`` (a fresh copy per
  test), ``prompts``: the tiny random Qwen3 of the trainer tests, built once per session;
- ``shared_tiny_model_dir`` (session): the same model in a folder reused across runs
  (``$RLF_TEST_MODELS_DIR``, default ``<tmp>/rlf-test-models``), for the rlf-serve subprocesses;
- ``tool_calling_model_dir`` (session): a copy fitted to answer with a ``sleep`` tool call, so a
  training run of it has tool calls to show;
- ``openai_server_instance`` (module) and ``openai_server`` (reset for each test): a scripted
  OpenAI-compatible server (:class:`tests.helpers.OpenAITestServer`);
- ``world`` (module): the generated DeepSearch world of seed 0;
- ``project`` and ``tabs``: an RLF Studio project over the echo fixture server, and the studio's
  page handlers (:mod:`tests.studio_fixtures.page`) over it, closed afterwards;
- ``_fresh_accelerate_state`` (autouse): Accelerate keeps one setting per process (mixed precision
  among them) in a singleton; each test ends by forgetting it, so the next test's trainer starts as
  a new run does.

torch and transformers are imported inside the fixtures, so env-only test runs never load them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import OpenAITestServer, build_tiny_model, tiny_model_path, tool_calling_model_path

# ------------------------------------------------------------------------------------------------
# The tiny random Qwen3
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder of the tiny Qwen3 (config, safetensors, tokenizer with chat template)."""
    return build_tiny_model(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def tiny_model(tiny_model_dir: Path) -> Any:
    """A fresh float32 copy of the tiny model per test (tests may change its weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


@pytest.fixture
def prompts(tiny_tokenizer: Any) -> list[list[int]]:
    """Three prompts of different lengths, so left padding is exercised."""
    from rlf_trainer.rollout.chat import prompt_ids

    return [
        prompt_ids(tiny_tokenizer, [{"role": "user", "content": "Who founded Velmora Works?"}]),
        prompt_ids(tiny_tokenizer, [{"role": "user", "content": "hi"}]),
        [5, 6, 7],
    ]


@pytest.fixture(scope="session")
def shared_tiny_model_dir() -> Path:
    """The tiny Qwen3 in a folder shared between test runs (skips the test without transformers)."""
    return tiny_model_path()


@pytest.fixture(scope="session")
def tool_calling_model_dir() -> Path:
    """The tiny Qwen3 fitted to call the latency server's ``sleep`` (:func:`tests.helpers.tool_calling_model_path`)."""
    return tool_calling_model_path()


# ------------------------------------------------------------------------------------------------
# A scripted OpenAI-compatible server
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def openai_server_instance() -> Iterator[OpenAITestServer]:
    server = OpenAITestServer().start()
    yield server
    server.stop()


@pytest.fixture
def openai_server(openai_server_instance: OpenAITestServer) -> OpenAITestServer:
    """The module's scripted server with its knobs and counters reset."""
    openai_server_instance.reset()
    return openai_server_instance


# ------------------------------------------------------------------------------------------------
# DeepSearch
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world() -> Any:
    """The generated DeepSearch world of seed 0 (deterministic; one per test module)."""
    from rlf_envs.tasks.deepsearch.world_builder import generate_world

    return generate_world(0)


# ------------------------------------------------------------------------------------------------
# Accelerate's per-process state
# ------------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _fresh_accelerate_state() -> Iterator[None]:
    yield
    state = sys.modules.get("accelerate.state")  # only where a test imported accelerate
    if state is not None:
        state.AcceleratorState._reset_state(reset_partial_state=True)


# ------------------------------------------------------------------------------------------------
# RLF Studio
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def project(tmp_path: Path) -> Any:
    """A studio project in ``tmp_path`` over the echo fixture server."""
    from tests.studio_fixtures.projects import echo_project

    return echo_project(tmp_path)


@pytest.fixture
def tabs(project: Any) -> Iterator[Any]:
    """The page's tabs over the studio that holds ``project`` (its servers and runs stop afterwards)."""
    from rlf_studio.ui.common import Studio
    from tests.studio_fixtures.page import page_tabs

    studio = Studio(project.root.parent)
    try:
        yield page_tabs(studio)
    finally:
        studio.close()
