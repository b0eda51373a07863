"""The Playground tab's backend: one episode of the project's env, turn by turn.

The env is ``gym.make("RLF/ToolUse-v0", mcp_servers=<project>/mcp.json, tasks=<project>/tasks/...,
reward=<the project's reward>)``: the very env training uses. The assistant turns come from the
person typing, or from any OpenAI-compatible endpoint (``rlf-serve``, vLLM, a hosted API).

Example:
    >>> chat_messages([{"role": "user", "content": "Hi <b>"}], {})
    [{'role': 'user', 'content': 'Hi &lt;b&gt;'}]
"""

from __future__ import annotations

import html
import json
from typing import Any

import gymnasium as gym

import rlf_envs  # noqa: F401  (registers the RLF/* ids)
from rlf_envs.info_keys import (
    ERRORS,
    FINISH_ANSWER,
    FINISH_MAX_TURNS,
    MESSAGES,
    REWARD_INFO,
    TASK_ID,
    TOOL_CALLS,
    TOOLS,
)
from rlf_envs.llm_client import OpenAIChatClient
from rlf_envs.loop_thread import LoopThread
from rlf_studio.project import Project
from rlf_studio.rewards import build_reward, load_spec

ENV_ID = "RLF/ToolUse-v0"
PLAYGROUND_RUN = "playground"  # the runs/ folder that keeps the episodes played by hand


class PlaygroundError(ValueError):
    """The project is not ready for an episode (no tasks, bad reward, servers that fail...)."""


def env_kwargs(project: Project, max_turns: int) -> dict[str, Any]:
    """The ``gym.make`` kwargs of the project's env (the reward as a built callable)."""
    if not project.has_tasks:
        raise PlaygroundError("the project has no tasks yet: save some in the Data tab")
    servers = (project.read_json(project.mcp_path, {}) or {}).get("mcpServers")
    kwargs: dict[str, Any] = {"tasks": str(project.train_tasks), "max_turns": int(max_turns)}
    if project.test_tasks.is_file():
        kwargs["test_tasks"] = str(project.test_tasks)
    if servers:
        kwargs["mcp_servers"] = str(project.mcp_path)
    kwargs["reward"] = build_reward(load_spec(project.reward_path))
    return kwargs


def _text(value: Any) -> str:
    return html.escape(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))


def _short(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def chat_messages(messages: list[dict[str, Any]], calls: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The env's chat as Gradio chatbot messages: tool calls and results as titled bubbles."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "system":
            out.append({"role": "assistant", "content": _text(message.get("content", "")),
                        "metadata": {"title": "system prompt", "status": "done"}})  # fmt: skip
        elif role == "user":
            out.append({"role": "user", "content": _text(message.get("content", ""))})
        elif role == "assistant":
            calls_made = message.get("tool_calls") or []
            empty = "(tool calls only)" if calls_made else "(empty turn)"
            out.append({"role": "assistant", "content": _text(message.get("content", "")) or empty})
            for call in calls_made:
                fn = call.get("function", {})
                title = f"tool call: {fn.get('name')} {_short(fn.get('arguments', {}))}"
                out.append({"role": "assistant", "content": _text(fn.get("arguments", {})),
                            "metadata": {"title": title, "status": "done"}})  # fmt: skip
        elif role == "tool":
            record = calls.get(message.get("tool_call_id", ""), {})
            status = "ok" if record.get("ok", True) else f"error {record.get('error')}"
            latency = f"{1000 * float(record.get('latency_s', 0.0)):.1f} ms"
            title = f"tool result: {message.get('name')} ({status}, {latency}): {_short(message.get('content', ''))}"
            out.append({"role": "assistant", "content": _text(message.get("content", "")),
                        "metadata": {"title": title, "status": "done"}})  # fmt: skip
    return out


def endpoint_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat in plain text form for an endpoint: tools in the system prompt, results as user turns.

    Example:
        >>> msgs = endpoint_messages([{"role": "system", "content": "S"}, {"role": "tool", "content": "r"}], [])
        >>> [m["role"] for m in msgs], msgs[1]["content"]
        (['system', 'user'], '<tool_response>\\nr\\n</tool_response>')
    """
    out = []
    tool_text = ""
    if tools:
        listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        tool_text = (
            f"\n\n# Tools\n<tools>\n{listed}\n</tools>\nTo call a tool, reply with "
            '<tool_call>{"name": <name>, "arguments": <object>}</tool_call>.'
        )
    for message in messages:
        role, content = message.get("role"), str(message.get("content") or "")
        if role == "system":
            out.append({"role": "system", "content": content + tool_text})
        elif role == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
        else:
            out.append({"role": role, "content": content})
    return out


class EpisodeSession:
    """One env and the episode it is playing."""

    def __init__(self, project: Project, max_turns: int = 4) -> None:
        self.env = gym.make(ENV_ID, **env_kwargs(project, max_turns))
        self.messages: list[dict[str, Any]] = []
        self.tools: list[dict[str, Any]] = []
        self.calls: dict[str, dict[str, Any]] = {}
        self.done = True
        self.total_reward = 0.0
        self.question = ""
        self.task_id = ""
        self.reward_info: dict[str, Any] = {}
        self.finish_reason = ""
        self._loop: LoopThread | None = None

    def num_tasks(self, split: str = "train") -> int:
        return int(self.env.unwrapped.num_tasks(split))

    def reset(self, task_index: int, split: str = "train") -> str:
        count = self.num_tasks(split)
        if not 0 <= task_index < count:
            raise PlaygroundError(f"task index must be between 0 and {count - 1}, got {task_index}")
        obs, info = self.env.reset(options={"task_index": int(task_index), "split": split})
        self.messages, self.tools, self.calls = info[MESSAGES], info[TOOLS], {}
        self.done, self.total_reward, self.question = False, 0.0, obs
        self.task_id, self.reward_info, self.finish_reason = str(info.get(TASK_ID, task_index)), {}, ""
        names = ", ".join(t["function"]["name"] for t in self.tools) or "none"
        return f"episode started on task {task_index} (tools: {names}); type the assistant's first turn"

    def step(self, action: str) -> str:
        if self.done:
            raise PlaygroundError("no episode is running: press New episode")
        _, reward, terminated, truncated, info = self.env.step(action)
        self.messages = info[MESSAGES]
        self.calls.update({c["id"]: c for c in info.get(TOOL_CALLS, [])})
        self.total_reward += float(reward)
        errors = ", ".join(info.get(ERRORS) or []) or "none"
        if terminated or truncated:
            self.done = True
            self.reward_info = dict(info.get(REWARD_INFO) or {})
            self.finish_reason = FINISH_ANSWER if terminated else FINISH_MAX_TURNS
            how = "answered" if terminated else "truncated (max turns)"
            details = json.dumps(info.get(REWARD_INFO, {}), default=str)
            return f"episode {how}: final reward **{self.total_reward:.3f}** ({details}); errors this turn: {errors}"
        return f"{len(info.get(TOOL_CALLS, []))} tool call(s), errors: {errors}; your turn"

    def model_turn(self, base_url: str, model: str, max_tokens: int = 512) -> str:
        """Ask an OpenAI-compatible endpoint for the next assistant turn (the text is returned)."""
        if not base_url or not model:
            raise PlaygroundError(
                "give the endpoint's base URL (e.g. http://127.0.0.1:8000/v1) and a model name"
            )
        if self._loop is None:
            self._loop = LoopThread("rlf-studio-model")
        client = OpenAIChatClient(base_url, model, retries=0)
        reply = self._loop.run(
            client.complete(endpoint_messages(self.messages, self.tools), max_tokens=max_tokens)
        )
        return reply.text

    def save(self, project: Project) -> str:
        """Append the finished episode to ``runs/playground/train_samples.jsonl`` (the trainer's format)."""
        if not self.messages or not self.done:
            raise PlaygroundError("finish the episode first (answer with <answer>...</answer>)")
        path = project.runs_dir / PLAYGROUND_RUN / "train_samples.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        step = sum(1 for line in path.open(encoding="utf-8") if line.strip()) + 1 if path.is_file() else 1
        record = {
            "kind": "playground", "step": step, "task_id": self.task_id, "group": 0, "prompt": self.question,
            "transcript": self.messages, "reward": self.total_reward, "reward_info": self.reward_info,
            "turns": sum(1 for m in self.messages if m.get("role") == "assistant"),
            "tool_calls": len(self.calls), "finish_reason": self.finish_reason,
        }  # fmt: skip
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        return f"saved as step {step} of the {PLAYGROUND_RUN!r} run (Runs tab, Rollouts)"

    def chat(self) -> list[dict[str, Any]]:
        return chat_messages(self.messages, self.calls)

    def tool_results(self) -> list[str]:
        """The texts of the episode's tool results, as the model read them (cut by the env)."""
        return [str(m.get("content") or "") for m in self.messages if m.get("role") == "tool"]

    def close(self) -> None:
        self.env.close()
        if self._loop is not None:
            self._loop.close()
