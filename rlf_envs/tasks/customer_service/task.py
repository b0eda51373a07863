"""``RLF/CustomerService-v0``: a tau-bench style shop agent that talks to a (simulated) customer.

The agent follows the shop's policy (system prompt), authenticates the customer, looks orders up
and changes them with the shop's MCP tools, and talks to the customer in plain turns, which the
user simulator answers (default: :func:`~rlf_envs.tasks.customer_service.customer.scripted_customer`;
any LLM endpoint through ``user_simulator={"base_url": ..., "model": ...}``). The episode ends
when the customer stops, the agent transfers to a human, or at ``max_turns``.

Per-episode state: :meth:`CustomerServiceTask.open_episode` copies the template database to a
file of the episode's own (a random token), and the env passes that token to every tool call as
the hidden ``episode`` argument, so concurrent episodes never see each other's writes.

Reward: 1.0 when the final database equals the goal state (the instance's gold writes replayed
on the template) and, where the scenario requires it, the agent told the customer the required
facts (e.g. an order's total); else 0.0. ``reward_info`` keeps ``db_match`` and ``outputs_ok``.

Example:
    >>> task = CustomerServiceTask(seed=0)
    >>> instance = task.instances("train")[0]
    >>> instance.question, instance.metadata["kind"]
    ('Hi, I would like to cancel one of my orders.', 'cancel')
"""

from __future__ import annotations

import asyncio
import functools
import secrets
import shutil
import sqlite3
import tempfile
import weakref
from pathlib import Path
from typing import Any

from rlf_envs.core.task import DialogueTask
from rlf_envs.dialogue.simulator import ScriptedUserSimulator
from rlf_envs.servers.launch import stdio_server_entry
from rlf_envs.tasks.customer_service.customer import scripted_customer
from rlf_envs.tasks.customer_service.data import generate_shop, write_shop
from rlf_envs.tasks.customer_service.scenarios import Scenario, make_scenarios
from rlf_envs.tasks.customer_service.server import episode_path
from rlf_envs.tasks.customer_service.store import apply_action, connect, snapshot
from rlf_envs.types import Episode, RewardValue, TaskInstance

SERVER_MODULE = "rlf_envs.tasks.customer_service.server"

SYSTEM_PROMPT = """\
You are a customer-service agent of an online shop. You help one customer per conversation.
Policy:
- First authenticate the customer: ask for their email and look it up with find_user_by_email. \
Do not look up or change anything else before that.
- Only act on orders of the authenticated customer (get_user lists them).
- Only pending orders can be cancelled or have their shipping address changed; cancelling needs \
a reason, "no longer needed" or "ordered by mistake". Only delivered orders can be refunded.
- Before any change (cancel, address change, refund), tell the customer what you will do and \
get their explicit yes.
- If a request is against the policy, explain that politely and do not change anything.
- If you cannot help, call transfer_to_human_agents.
Write to the customer in plain text (no tool call in that turn); the customer then answers. \
Call tools with <tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks."""


class CustomerServiceTask(DialogueTask):
    """The shop task; see the module docs.

    Args:
        seed: seed of the shop and the scenarios.
        max_turns: assistant turns (tool turns and messages) before the episode is truncated.
        num_users: users in the generated shop (one scenario each).
        require_outputs: also require the facts a scenario asks for in the agent's messages.
        workdir: where the template and episode databases live (default: a fresh temp folder,
            removed when the task is garbage-collected).
    """

    name = "customer_service"
    system_prompt = SYSTEM_PROMPT
    hidden_arguments = ("episode",)
    terminating_tools = frozenset({"transfer_to_human_agents"})

    def __init__(
        self,
        *,
        seed: int = 0,
        max_turns: int = 12,
        num_users: int = 30,
        require_outputs: bool = True,
        workdir: str | Path | None = None,
    ) -> None:
        self.seed = seed
        self.max_turns = max_turns
        self.require_outputs = require_outputs
        self.shop = generate_shop(seed, num_users=num_users)
        self.scenarios = {s.id: s for s in make_scenarios(self.shop, seed)}
        if workdir is None:
            workdir = tempfile.mkdtemp(prefix="rlf-cs-")
            weakref.finalize(self, shutil.rmtree, workdir, True)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.template = write_shop(self.shop, self.workdir / "template.sqlite")
        self._goals: dict[str, dict[str, list[tuple[Any, ...]]]] = {}

    @functools.cached_property
    def split_instances(self) -> dict[str, list[TaskInstance]]:
        return {
            split: [self._instance(s) for s in self.scenarios.values() if s.split == split]
            for split in ("train", "test")
        }

    def _instance(self, scenario: Scenario) -> TaskInstance:
        metadata = {
            "kind": scenario.kind,
            "persona": scenario.persona,
            "user_instructions": scenario.instructions,
            "facts": {**scenario.facts, "kind": scenario.kind},
            "required_outputs": list(scenario.required_outputs),
        }
        answer = {"actions": [list(a) for a in scenario.gold_actions]}
        return TaskInstance(id=scenario.id, question=scenario.opening, answer=answer, metadata=metadata)

    def mcp_config(self) -> dict[str, Any]:
        entry = stdio_server_entry(SERVER_MODULE, ["--root", str(self.workdir)], timeout_s=30.0)
        return {"mcpServers": {"shop": entry}}

    def default_user_simulator(self) -> ScriptedUserSimulator:
        return ScriptedUserSimulator(scripted_customer)

    # ------------------------------------------------------------------ per-episode state
    def open_episode(self, instance: TaskInstance) -> dict[str, Any]:
        """A private copy of the template database; its token is the tools' hidden ``episode``."""
        token = secrets.token_hex(16)
        shutil.copyfile(self.template, episode_path(self.workdir, token))
        return {"episode": token}

    def close_episode(self, episode_args: dict[str, Any]) -> None:
        token = episode_args.get("episode")
        if token:
            path = episode_path(self.workdir, token)
            for suffix in ("", "-journal", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)

    # ------------------------------------------------------------------ reward
    def goal_state(self, instance: TaskInstance) -> dict[str, list[tuple[Any, ...]]]:
        """The database the instance's gold writes lead to (replayed on an in-memory copy)."""
        if instance.id not in self._goals:
            source = sqlite3.connect(self.template)
            conn = sqlite3.connect(":memory:", isolation_level=None)
            source.backup(conn)
            source.close()
            conn.row_factory = sqlite3.Row
            for name, arguments in instance.answer["actions"]:
                apply_action(conn, name, dict(arguments))
            conn.row_factory = None
            self._goals[instance.id] = snapshot(conn)
            conn.close()
        return self._goals[instance.id]

    def final_state(self, episode_args: dict[str, Any]) -> dict[str, list[tuple[Any, ...]]]:
        """The episode's database as it is now."""
        conn = connect(episode_path(self.workdir, episode_args["episode"]))
        conn.row_factory = None
        try:
            return snapshot(conn)
        finally:
            conn.close()

    def _score(self, episode: Episode) -> dict[str, Any]:
        final = self.final_state(episode.episode_args)
        goal = self.goal_state(episode.instance)
        changed = sorted(t for t in goal if goal[t] != final.get(t))
        said = " ".join(
            (m.get("content") or "") for m in episode.messages if m.get("role") == "assistant"
        ).lower()
        required = (
            list(episode.instance.metadata.get("required_outputs") or []) if self.require_outputs else []
        )
        missing = [r for r in required if r.lower() not in said]
        db_match = not changed
        reward = float(db_match and not missing)
        return {"reward": reward, "acc": reward, "db_match": db_match, "outputs_ok": not missing,
                "tables_off_goal": changed, "missing_outputs": missing}  # fmt: skip

    async def reward(self, episode: Episode) -> RewardValue:
        """1.0 when the final database equals the goal state and the required facts were said."""
        return await asyncio.to_thread(self._score, episode)
