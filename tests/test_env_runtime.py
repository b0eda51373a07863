"""The shared env runtime: per-env seeding, the settings both env classes take, the info keys' docs,
the registered ids' one factory."""

import asyncio

import gymnasium as gym
import pytest

import rlf_envs
from envs_registry import ENV_IDS
from rlf_envs import info_keys
from rlf_envs.core.env import ToolEnv
from rlf_envs.core.env_runtime import EnvSettings
from rlf_envs.core.task import DialogueTask, FunctionTask, default_user_simulator_for, user_instructions_for
from rlf_envs.core.vector import ToolVectorEnv
from rlf_envs.factories import build_task
from rlf_envs.tasks.tool_use import make_tool_use_task
from rlf_envs.types import TaskInstance
from tests.helpers import REPO

# Many instances, so that two different draws almost never pick the same one by chance.
TASKS = [{"id": f"q{i}", "question": f"question {i}", "answer": str(i)} for i in range(1000)]


def count(text: str) -> int:
    """Count the characters of a text.

    Args:
        text: any text
    """
    return len(text)


def vector(num_envs: int) -> ToolVectorEnv:
    return ToolVectorEnv(make_tool_use_task(tasks=TASKS), num_envs, autoreset_mode="Disabled")


def single_env_draw(seed: int) -> str:
    """The instance a ToolEnv reset with ``seed`` draws."""
    env = ToolEnv(make_tool_use_task(tasks=TASKS))
    try:
        return env.reset(seed=seed)[1][info_keys.TASK_ID]
    finally:
        env.close()


def test_reset_seed_list_seeds_env_i_with_seed_i():
    envs = vector(3)
    try:
        seeds = [11, 502, 77]
        ids = list(envs.reset(seed=seeds)[1][info_keys.TASK_ID])
        assert ids == [single_env_draw(s) for s in seeds]
        assert list(envs.reset(seed=seeds[::-1])[1][info_keys.TASK_ID]) == ids[::-1]
        # an int seeds env i with seed + i, as Gymnasium's vector envs do
        assert list(envs.reset(seed=11)[1][info_keys.TASK_ID]) == [single_env_draw(s) for s in (11, 12, 13)]
        # None keeps that env's RNG: env 1 goes on drawing from its stream
        again = list(envs.reset(seed=[11, None, 77])[1][info_keys.TASK_ID])
        assert again[0] == ids[0] and again[2] == ids[2]
    finally:
        envs.close()


def test_reset_seed_list_of_the_wrong_length_is_a_clear_error():
    envs = vector(3)
    try:
        with pytest.raises(ValueError, match="one seed per env: 3 envs, got 2 seeds"):
            envs.reset(seed=[1, 2])
    finally:
        envs.close()


def test_areset_one_seeds_only_that_env():
    seeded, untouched = vector(3), vector(3)
    try:
        seeded.reset(seed=[1, 2, 3])
        untouched.reset(seed=[1, 2, 3])
        _, info = asyncio.run(seeded.areset_one(1, seed=42))
        assert info[info_keys.TASK_ID] == single_env_draw(42)

        def next_draws(envs: ToolVectorEnv) -> list[str]:
            return [asyncio.run(envs.areset_one(i))[1][info_keys.TASK_ID] for i in (0, 2)]

        # envs 0 and 2 go on with their own streams, as if env 1 had never been reseeded
        assert next_draws(seeded) == next_draws(untouched)
        with pytest.raises(IndexError):
            asyncio.run(seeded.areset_one(3, seed=0))
    finally:
        seeded.close()
        untouched.close()


def test_single_and_vector_env_share_one_set_of_settings():
    with pytest.raises(TypeError, match="did you mean 'max_turns'"):
        gym.make("RLF/ToolUse-v0", tasks=TASKS[:2], max_turn=3)
    with pytest.raises(TypeError, match="ToolVectorEnv got an unexpected keyword argument 'autoreset'"):
        ToolVectorEnv(make_tool_use_task(tasks=TASKS[:2]), 2, autoreset="Disabled")
    env = gym.make("RLF/ToolUse-v0", tasks=TASKS[:2], max_turns=3, tool_timeout_s=7.0)
    envs = gym.make_vec("RLF/ToolUse-v0", num_envs=2, tasks=TASKS[:2], max_turns=3, tool_timeout_s=7.0)
    try:
        assert env.unwrapped.runtime.settings == envs.unwrapped.runtime.settings
        assert env.unwrapped.runtime.settings.tool_timeout_s == 7.0
        assert env.unwrapped.num_tasks() == envs.unwrapped.num_tasks() == 2
        env.reset(seed=0)
        assert env.unwrapped.tools == envs.unwrapped.tools == []
    finally:
        env.close()
        envs.close()
    assert {f for f in EnvSettings.__dataclass_fields__} >= {"mcp_servers", "parser", "user_simulator"}


def test_closed_single_env_starts_again_on_reset():
    env = ToolEnv(make_tool_use_task(tasks=TASKS[:3]))
    env.reset(seed=0, options={"task_index": 1})
    env.close()
    assert env.runtime.loop is None
    obs, _ = env.reset(seed=0, options={"task_index": 2})
    assert obs == "question 2" and env.step("<answer>2</answer>")[1] == 1.0
    env.close()
    with pytest.raises(RuntimeError, match=r"step\(\) before reset\(\)"):
        env.step("<answer>2</answer>")


def _documented_info_keys() -> list[tuple[str, ...]]:
    text = (REPO / "docs" / "env_contract.md").read_text()
    section = text.split("## Info keys", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [tuple(cell.strip() for cell in row.strip("|").split(" | ")) for row in rows]


def test_every_info_key_is_documented_as_in_the_module():
    expected = [
        (f"`{k.name}`", f"`{k.name.upper()}`", f"`{k.type}`", k.when, k.meaning) for k in info_keys.INFO_KEYS
    ]
    assert _documented_info_keys() == expected
    for key in info_keys.INFO_KEYS:
        assert getattr(info_keys, key.name.upper()) == key.name
    assert info_keys.FINISH_REASONS == ("answer", "max_turns", "max_total_tokens", "sim_error")


def test_env_writes_only_documented_info_keys():
    documented = {k.name for k in info_keys.INFO_KEYS}
    env = gym.make("RLF/ToolUse-v0", tasks=TASKS[:3], python_tools=[count], max_turns=3)
    try:
        _, info = env.reset(seed=0)
        seen = set(info)
        seen |= set(env.step('<tool_call>{"name": "count", "arguments": {"text": "abc"}}</tool_call>')[-1])
        seen |= set(env.step("<answer>1</answer>")[-1])
    finally:
        env.close()
    assert seen <= documented, seen - documented
    assert {info_keys.TOOL_CALLS, info_keys.REWARD_INFO, info_keys.TASK_ID} <= seen


@pytest.mark.parametrize("env_id", sorted(ENV_IDS))
def test_every_registered_id_builds_its_task_through_the_one_factory(env_id):
    spec = gym.spec(env_id)
    assert (spec.entry_point, spec.vector_entry_point) == (
        "rlf_envs.factories:make_env",
        "rlf_envs.factories:make_vec",
    )
    kwargs = {"max_turns": 2, **({"tasks": TASKS[:2]} if env_id == "RLF/ToolUse-v0" else {})}
    task = build_task(spec.kwargs["task_entry"], kwargs, spec.kwargs.get("task_defaults"))
    assert task.instances("train") and task.splits()
    assert set(task.split_instances) == set(task.splits())
    assert env_id != "RLF/Codebook-v0" or task.name == "codebook"
    assert isinstance(task, DialogueTask) == (env_id == "RLF/CustomerService-v0")


def test_codebook_id_is_tool_use_with_codebook_defaults_that_can_be_overridden():
    env = gym.make("RLF/Codebook-v0", system_prompt="Be brief.")
    try:
        assert env.unwrapped.task.name == "codebook" and env.unwrapped.task.system_prompt == "Be brief."
        _, info = env.reset(seed=0)
        assert [t["function"]["name"] for t in info[info_keys.TOOLS]] == ["lookup"]
    finally:
        env.close()


def test_dialogue_hooks_only_on_dialogue_tasks():
    instance = TaskInstance(
        "0", "Hi", metadata={"persona": "You are Ann.", "user_instructions": "Cancel W1."}
    )
    plain = FunctionTask("plain", [instance], lambda ep: 0.0)
    assert not hasattr(plain, "user_instructions") and not hasattr(plain, "default_user_simulator")
    assert user_instructions_for(plain, instance) == "You are Ann.\nCancel W1."
    assert default_user_simulator_for(plain) is None

    class Shop(DialogueTask):
        split_instances = {"train": [instance]}

        def user_instructions(self, instance: TaskInstance) -> str:
            return "only this"

    assert user_instructions_for(Shop(), instance) == "only this"


def test_the_package_exports_its_env_ids():
    assert "ENV_IDS" in rlf_envs.__all__
