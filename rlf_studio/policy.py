"""A policy behind an OpenAI-compatible endpoint: serve a run's model, play and score episodes with it.

:func:`serve_model` starts ``python -m rlf_serve --model <run>/model`` (the trained Hugging Face
folder the trainer writes) as a subprocess; :func:`play_episodes` lets any endpoint (that one,
``rlf-serve`` on the base model, vLLM, a hosted API) play the project's env on a split, which the
Runs tab uses to evaluate a trained model and the Reward tab to preview the reward on real
rollouts before training.

Example:
    >>> serve_command(Path("/runs/r1/model"), 8001, "r1")[1:5]
    ['-m', 'rlf_serve', '--model', '/runs/r1/model']
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from rlf_studio.playground import EpisodeSession, PlaygroundError
from rlf_studio.project import Project
from rlf_studio.runner import RunProcess

SERVE_LOG = "serve.log"
EPISODE_COLUMNS = ["task", "question", "final response", "reward", "turns", "tool calls", "errors"]


def serve_command(model_dir: Path, port: int, name: str) -> list[str]:
    return [sys.executable, "-m", "rlf_serve", "--model", str(model_dir), "--host", "127.0.0.1",
            "--port", str(port), "--served-model-name", name, "--device", "cpu"]  # fmt: skip


def wait_ready(base_url: str, run: RunProcess, timeout_s: float = 180.0) -> None:
    """Until ``GET <base_url>/models`` answers; RuntimeError with the log tail when the server exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not run.running:
            raise RuntimeError(f"the model server exited ({run.status()}): {run.log_tail(8)}")
        try:
            with urllib.request.urlopen(f"{base_url}/models", timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    run.abort(grace_s=5)
    raise RuntimeError(f"the model server did not answer within {timeout_s:.0f} s")


def serve_model(
    model_dir: Path, log_dir: Path, port: int, env: dict[str, str]
) -> tuple[RunProcess, str, str]:
    """Serve a Hugging Face model folder (a run's ``model/``); returns (the process, its base URL, the model name).

    The server's output goes to ``<log_dir>/serve.log``; the model is named after the folder it
    belongs to (the run's name for ``<run>/model``).
    """
    if not (model_dir / "config.json").is_file():
        raise PlaygroundError(f"{model_dir} holds no trained model (a run writes model/ when it finishes)")
    name = model_dir.parent.name if model_dir.name == "model" else model_dir.name
    run = RunProcess.start(serve_command(model_dir, port, name), log_dir, env, log_name=SERVE_LOG)
    base_url = f"http://127.0.0.1:{port}/v1"
    wait_ready(base_url, run)
    return run, base_url, name


def play_episodes(
    project: Project, base_url: str, model: str, *, split: str = "test", limit: int = 4, max_turns: int = 4,
    max_tokens: int = 256,
) -> tuple[list[list[Any]], str]:  # fmt: skip
    """Let the endpoint play the first ``limit`` tasks of ``split``: (table rows, a summary line)."""
    session = EpisodeSession(project, max_turns=max_turns)
    rows: list[list[Any]] = []
    try:
        count = min(int(limit), session.num_tasks(split))
        for index in range(count):
            session.reset(index, split=split)
            errors: list[str] = []
            while not session.done:
                text = session.model_turn(base_url, model, max_tokens=max_tokens)
                session.step(text)
                errors += [str(e) for c in session.calls.values() if (e := c.get("error"))]
            final = next(
                (m.get("content") for m in reversed(session.messages) if m.get("role") == "assistant"), ""
            )
            turns = sum(1 for m in session.messages if m.get("role") == "assistant")
            rows.append([session.task_id, session.question, str(final)[:300], round(session.total_reward, 3),
                         turns, len(session.calls), ", ".join(sorted(set(errors))) or "none"])  # fmt: skip
    finally:
        session.close()
    mean = sum(r[3] for r in rows) / len(rows) if rows else 0.0
    return rows, f"{len(rows)} {split} episode(s) played by {model!r}: mean reward {mean:.3f}"


def _plain(content: Any) -> str:
    """A chat message's text (Gradio may hand content over as a list of typed parts).

    Example:
        >>> _plain([{"type": "text", "text": "hi"}]), _plain("yo")
        ('hi', 'yo')
    """
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


def chat_once(base_url: str, model: str, history: list[dict[str, Any]], message: str) -> list[dict[str, Any]]:
    """One chat turn with the endpoint (no env, no tools): the history with both new messages."""
    import asyncio

    from rlf_envs.llm_client import OpenAIChatClient

    messages = [{"role": m["role"], "content": _plain(m.get("content"))} for m in history] + [
        {"role": "user", "content": message}
    ]
    client = OpenAIChatClient(base_url, model, retries=0)
    reply = asyncio.run(client.complete(messages, max_tokens=256, temperature=0.7))
    return [*messages, {"role": "assistant", "content": reply.text or json.dumps(reply.finish_reason)}]
