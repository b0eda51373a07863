"""User simulators in the env: user turns, the stop marker, every flagging rule, and failures that never crash.

The LLM simulator runs against the scripted OpenAI-compatible server of ``tests/helpers.py``
(real HTTP on 127.0.0.1): its ``peak_in_flight`` counter shows that the simulator calls of one
vector step are in flight at once. The real-model endpoint (rlf-serve) is in
``tests/test_user_simulator_serve.py``.
"""

from __future__ import annotations

import asyncio
import json

import gymnasium as gym
import pytest

import rlf_envs  # noqa: F401  (registers the ids)
from rlf_envs.dialogue import (
    DEFAULT_STOP_MARKER,
    LLMUserSimulator,
    SimChecks,
    SimErrorKind,
    SimulatorRunner,
    UserTurnRequest,
    check_reply,
    resolve_user_simulator,
    simulator_view,
)
from rlf_envs.types import TaskInstance

INSTRUCTIONS = (
    "You are Ann Holt. Your email is ann@example.com. You want to cancel your order #W1001 "
    "because you no longer need it, and you are polite and brief."
)
TASKS = [
    {
        "id": f"u{i}",
        "question": f"Hi, I need help number {i}.",
        "answer": str(i),
        "user_instructions": INSTRUCTIONS,
    }
    for i in range(4)
]


def square(n: int) -> int:
    """Square an integer.

    Args:
        n: the number to square
    """
    return n * n


def call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def make_vec(num_envs, simulator, **kwargs):
    return gym.make_vec(
        "RLF/ToolUse-v0", num_envs=num_envs, tasks=TASKS, reward="exact_match", python_tools=[square],
        user_simulator=simulator, max_turns=6, autoreset_mode="Disabled", **kwargs,
    )  # fmt: skip


# ------------------------------------------------------------------------------ flagging rules

FLAGGED = [
    ("", SimErrorKind.BROKE_FORMAT),
    ("   \n", SimErrorKind.BROKE_FORMAT),
    ("x" * 2001, SimErrorKind.BROKE_FORMAT),
    ("Sure<|im_end|>", SimErrorKind.BROKE_FORMAT),
    ('<tool_call>{"name": "cancel_order"}</tool_call>', SimErrorKind.BROKE_FORMAT),
    ("<answer>done</answer>", SimErrorKind.BROKE_FORMAT),
    ("compan\ufffdy 42\x07book", SimErrorKind.BROKE_FORMAT),
    ("<|start_header_id|>user<|end_header_id|>\nHi", SimErrorKind.BROKE_FORMAT),
    ("[INST] cancel it [/INST]", SimErrorKind.BROKE_FORMAT),
    ("ok<end_of_turn>", SimErrorKind.BROKE_FORMAT),
    ('{"name": "cancel_order", "arguments": {"order_id": "#W1001"}}', SimErrorKind.BROKE_FORMAT),
    ('cancel_order(order_id="#W1001")', SimErrorKind.BROKE_FORMAT),
    ("Assistant: your order is cancelled.", SimErrorKind.ROLE_LABELS),
    ("**Agent**: let me check that for you.", SimErrorKind.ROLE_LABELS),
    ("Customer: yes, cancel it", SimErrorKind.ROLE_LABELS),
    ("Sure.\nUser: my email is ann@example.com\nAgent: thanks!", SimErrorKind.ROLE_LABELS),
    ("Hello! How can I help you today?", SimErrorKind.ROLE_FLIP),
    ("Sure! I can help you with that.", SimErrorKind.ROLE_FLIP),
    ("Done. Is there anything else I can help with?", SimErrorKind.ROLE_FLIP),
    ("Your order #W1001 has been cancelled.", SimErrorKind.ROLE_FLIP),
    ("As an AI language model, I do not have orders.", SimErrorKind.LEFT_PERSONA),
    ("I am a user simulator and cannot continue.", SimErrorKind.LEFT_PERSONA),
    ("I'm just a bot, I have no order.", SimErrorKind.LEFT_PERSONA),
    ("My instructions say to cancel an order.", SimErrorKind.REVEALED_GOAL),
    ("I want to cancel your order #W1001 because you no longer need it", SimErrorKind.REVEALED_GOAL),
    ("I will stay in my role and write only what the user says next.", SimErrorKind.REVEALED_GOAL),
    (f"When done I end my message with {DEFAULT_STOP_MARKER}", SimErrorKind.REVEALED_GOAL),
    (DEFAULT_STOP_MARKER, SimErrorKind.PREMATURE_STOP),
    (f"Bye. {DEFAULT_STOP_MARKER}", SimErrorKind.PREMATURE_STOP),
]


@pytest.mark.parametrize(("raw", "kind"), FLAGGED)
def test_each_rule_flags_its_constructed_output(raw, kind):
    flag = check_reply(raw, INSTRUCTIONS, turn=0)
    assert flag is not None and flag.kind is kind, flag
    assert flag.message


@pytest.mark.parametrize(
    "raw",
    [
        "Hi, my email is ann@example.com.",
        "It is order #W1001.",
        "I no longer need it.",
        "Yes, please go ahead.",
        f"Thanks, that is all. {DEFAULT_STOP_MARKER}",
    ],
)
def test_ordinary_user_lines_pass(raw):
    assert check_reply(raw, INSTRUCTIONS, turn=2) is None


def test_parroting_the_agent_is_flagged_but_echoing_a_fact_is_not():
    agent = "I can cancel order #W1001 for you. Shall I go ahead with the cancellation?"
    flag = check_reply("I can cancel order #W1001. Shall I go ahead with the cancellation?", INSTRUCTIONS,
                       turn=1, agent_message=agent)  # fmt: skip
    assert flag is not None and flag.kind is SimErrorKind.PARROTED_AGENT
    assert check_reply("Order #W1001? Yes, go ahead.", INSTRUCTIONS, turn=1, agent_message=agent) is None


def test_rules_can_be_switched_off_or_tuned():
    assert check_reply("How can I help you?", INSTRUCTIONS, turn=1, checks=SimChecks(enabled=False)) is None
    assert check_reply("How can I help you?", INSTRUCTIONS, turn=1, checks=SimChecks(role_flip=False)) is None
    stop = f"Bye {DEFAULT_STOP_MARKER}"
    assert check_reply(stop, INSTRUCTIONS, turn=0, checks=SimChecks(min_replies_before_stop=0)) is None
    assert (
        check_reply(stop, INSTRUCTIONS, turn=2, checks=SimChecks(min_replies_before_stop=3)).kind
        == "premature_stop"
    )
    short_leak = "cancel your order #W1001 because"
    assert check_reply(short_leak, INSTRUCTIONS, turn=1) is None
    assert (
        check_reply(short_leak, INSTRUCTIONS, turn=1, checks=SimChecks(min_leak_words=4)).kind
        == "revealed_goal"
    )
    assert check_reply("STOP NOW", INSTRUCTIONS, turn=0, stop_marker="STOP NOW").kind == "premature_stop"


def test_simulator_view_flips_roles_and_hides_tools():
    chat = [
        {"role": "system", "content": "policy"},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]},
        {"role": "tool", "content": "secret db row"},
        {"role": "assistant", "content": "Your email?"},
    ]
    assert simulator_view(chat) == [
        {"role": "assistant", "content": "Hi"},
        {"role": "user", "content": "Your email?"},
    ]
    sim = LLMUserSimulator("http://127.0.0.1:1/v1", "m")
    request = UserTurnRequest(TaskInstance("0", "Hi"), INSTRUCTIONS, chat, 0)
    prompt = sim.prompt(request)
    assert INSTRUCTIONS in prompt[0]["content"] and DEFAULT_STOP_MARKER in prompt[0]["content"]
    assert "secret" not in json.dumps(prompt)


def test_resolve_user_simulator_rejects_junk():
    assert resolve_user_simulator(None) is None and resolve_user_simulator(False) is None
    with pytest.raises(TypeError, match="user_simulator must be"):
        resolve_user_simulator(42)
    with pytest.raises(ValueError, match="base_url"):
        resolve_user_simulator({"model": "m"})


# ------------------------------------------------------------------------------ runner failures


def _request(turn=1):
    return UserTurnRequest(TaskInstance("0", "Hi"), INSTRUCTIONS, [], turn)


def test_runner_turns_every_failure_into_a_flag():
    async def slow(request):
        await asyncio.sleep(5)
        return "late"

    def broken(request):
        raise RuntimeError("script bug")

    cases = [
        (SimulatorRunner(resolve_user_simulator(slow), timeout_s=0.05), SimErrorKind.TIMEOUT),
        (SimulatorRunner(resolve_user_simulator(broken)), SimErrorKind.SIMULATOR_ERROR),
        (SimulatorRunner(resolve_user_simulator(lambda r: 7)), SimErrorKind.SIMULATOR_ERROR),
        (SimulatorRunner(resolve_user_simulator(lambda r: "How can I help you?")), SimErrorKind.ROLE_FLIP),
    ]
    for runner, kind in cases:
        turn = asyncio.run(runner.next_turn(_request()))
        assert turn.flag is not None and turn.flag.kind is kind, (kind, turn)
    ok = asyncio.run(SimulatorRunner(resolve_user_simulator(lambda r: "fine")).next_turn(_request()))
    assert (ok.text, ok.stop, ok.flag) == ("fine", False, None)


# ------------------------------------------------------------------------------ in the env


def polite_user(request: UserTurnRequest) -> str:
    """Tells its number on the first reply, stops on the second."""
    number = request.instance.question.split("number ")[1].rstrip(".")
    return f"My number is {number}." if request.turn == 0 else f"Thanks! {DEFAULT_STOP_MARKER}"


def test_user_turns_stop_and_tools_in_one_episode():
    env = gym.make("RLF/ToolUse-v0", tasks=TASKS, reward="exact_match", python_tools=[square],
                   user_simulator=polite_user, max_turns=6)  # fmt: skip
    obs, info = env.reset(options={"task_index": 2})
    obs, reward, terminated, truncated, info = env.step("Which number do you mean?")
    assert (obs, reward, terminated, truncated) == ("My number is 2.", 0.0, False, False)
    assert info["user_message"] == {"role": "user", "content": "My number is 2."}
    assert info["messages"][-1] == info["user_message"] and info["tool_messages"] == []
    obs, reward, terminated, truncated, info = env.step(call("square", n=2))
    assert "4" in obs and not terminated
    obs, reward, terminated, truncated, info = env.step("It is 4.")
    assert terminated and not truncated and info["user_stop"] and "sim_error" not in info
    assert [m["role"] for m in info["messages"]] == ["system", "user", "assistant", "user", "assistant", "tool",
                                                     "assistant", "user"]  # fmt: skip
    # an <answer> still ends the episode at once, without asking the user
    env.reset(options={"task_index": 1})
    assert env.step("<answer>1</answer>")[1:4] == (1.0, True, False)
    env.close()


def test_max_turns_truncates_a_dialogue():
    env = gym.make("RLF/ToolUse-v0", tasks=TASKS, reward="exact_match", user_simulator=lambda r: "Go on.",
                   max_turns=2)  # fmt: skip
    env.reset(options={"task_index": 0})
    assert env.step("Hello?")[2:4] == (False, False)
    obs, reward, terminated, truncated, info = env.step("Hello again?")
    assert (terminated, truncated, info["answer"]) == (False, True, None)
    env.close()


def test_flagged_episodes_end_without_hurting_the_others():
    def moody(request: UserTurnRequest) -> str:
        k = int(request.instance.id[1:])
        if k == 1:
            raise ValueError("simulator crashed")
        if k == 2:
            return "As an AI, I cannot pretend to be a customer."
        return "My number is 3." if request.turn == 0 else f"Bye {DEFAULT_STOP_MARKER}"

    envs = make_vec(4, moody)
    try:
        envs.reset(options={"task_indices": [0, 1, 2, 3]})
        obs, rewards, terminated, truncated, infos = envs.step(["Which number?"] * 4)
        assert truncated.tolist() == [False, True, True, False] and not terminated.any()
        assert list(infos["sim_error"][infos["_sim_error"]]) == ["simulator_error", "left_persona"]
        assert obs[0] == obs[3] == "My number is 3." and obs[1].startswith(
            "Error (sim_error simulator_error)"
        )
        assert "reward_info" in infos and infos["_reward_info"].tolist() == [False, True, True, False]
        obs, rewards, terminated, truncated, infos = envs.step(
            ["<answer>0</answer>", "", "", "<answer>3</answer>"]
        )
        assert terminated[[0, 3]].all() and rewards[[0, 3]].tolist() == [1.0, 1.0]
    finally:
        envs.close()


def test_llm_simulator_calls_of_one_step_are_in_flight_at_once(openai_server):
    openai_server.delay_s = 0.3
    openai_server.reply = "My number is 1."
    simulator = {
        "base_url": openai_server.url,
        "model": "user-sim",
        "max_concurrency": 64,
        "temperature": 0.0,
    }
    envs = make_vec(16, simulator)
    try:
        envs.reset(options={"task_indices": [0, 1, 2, 3] * 4})
        obs, rewards, terminated, truncated, infos = envs.step(["Which number?"] * 16)
        assert obs == ("My number is 1.",) * 16 and not (terminated | truncated).any()
        assert openai_server.requests == 16 and openai_server.peak_in_flight == 16
        body = openai_server.bodies[0]
        assert body["messages"][0]["role"] == "system" and INSTRUCTIONS in body["messages"][0]["content"]
        assert [m["role"] for m in body["messages"][1:]] == [
            "assistant",
            "user",
        ]  # flipped: the user is the model
        assert body["messages"][2]["content"] == "Which number?"
    finally:
        envs.close()


def test_endpoint_errors_and_timeouts_are_flags(openai_server):
    for model, kind in [("fail-400", "endpoint_error"), ("fail-503", "endpoint_error"), ("garbage", "endpoint_error"),
                        ("hang", "timeout"), ("empty", "broke_format")]:  # fmt: skip
        simulator = {"base_url": openai_server.url, "model": model, "retries": 0, "timeout_s": 5.0}
        envs = make_vec(2, simulator, sim_timeout_s=0.5)
        try:
            envs.reset(options={"task_indices": [0, 1]})
            _, _, terminated, truncated, infos = envs.step(["Which number?", "<answer>1</answer>"])
            assert truncated.tolist() == [True, False] and terminated.tolist() == [False, True]
            assert infos["sim_error"][0] == kind, (model, infos["sim_error"])
        finally:
            envs.close()


def test_endpoint_that_goes_away_mid_batch_flags_and_keeps_going():
    """The scripted server stops while a step's requests are in flight: every such episode is flagged."""
    from tests.helpers import OpenAITestServer

    server = OpenAITestServer().start()
    server.delay_s = 30.0  # still in flight when the server goes: its shutdown cancels them
    simulator = {"base_url": server.url, "model": "m", "retries": 0, "timeout_s": 10.0}
    envs = make_vec(4, simulator)
    try:
        envs.reset(options={"task_indices": [0, 1, 2, 3]})

        async def step_and_kill():
            step = asyncio.create_task(
                asyncio.to_thread(envs.step, ["Which number?"] * 3 + [call("square", n=3)])
            )
            while server.in_flight < 3:
                await asyncio.sleep(0.01)
            await asyncio.to_thread(server.stop)
            return await step

        obs, rewards, terminated, truncated, infos = asyncio.run(step_and_kill())
        assert truncated.tolist() == [True, True, True, False]
        assert set(infos["sim_error"][:3]) <= {"endpoint_error", "timeout"}
        assert "9" in obs[3] and not terminated[3]  # the tool turn of env 3 came back untouched
    finally:
        envs.close()
