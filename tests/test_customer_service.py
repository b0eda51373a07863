"""RLF/CustomerService-v0 with its real shop MCP server (stdio) and the scripted customer.

A scripted correct agent gets reward 1 on every scenario kind and wrong action sequences get 0;
64 episodes of one vector env write to "the same" order at once and each sees only its own write.
"""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import rlf_envs  # noqa: F401  (registers the ids)
from rlf_envs.tasks.customer_service import KINDS, CustomerServiceTask, generate_shop, make_scenarios


def call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture(scope="module")
def env():
    env = gym.make("RLF/CustomerService-v0")
    yield env
    env.close()


def instances(env, split="train"):
    return list(env.unwrapped.task.instances(split))


def first_of_kind(env, kind):
    return next(k for k, inst in enumerate(instances(env)) if inst.metadata["kind"] == kind)


def correct_actions(instance, shop) -> list[str]:
    """What a policy-following agent says and calls for ``instance`` (the scripted user answers)."""
    facts, kind = instance.metadata["facts"], instance.metadata["kind"]
    oid = facts["order_id"]
    actions = ["Hello! To start, what is your email address?", call("find_user_by_email", email=facts["email"]),
               "Thanks. Which order is it about?", call("get_order", order_id=oid)]  # fmt: skip
    if kind == "cancel":
        actions += ["What is the reason for cancelling?", f"I will cancel {oid} now. Do you confirm?",
                    call("cancel_order", order_id=oid, reason=facts["reason"]), "Your order has been cancelled."]  # fmt: skip
    elif kind == "address":
        actions += ["What is the new address?", f"I will update {oid}. Do you confirm?",
                    call("change_address", order_id=oid, address=facts["address"]),
                    "The address has been updated."]  # fmt: skip
    elif kind == "refund":
        actions += [f"I will refund {oid} in full. Do you confirm?", call("refund_order", order_id=oid),
                    "Your refund has been processed."]  # fmt: skip
    elif kind == "total":
        order = next(o for o in shop.orders if o.order_id == oid)
        actions += [f"The total of your order is ${shop.total_cents(order) / 100:.2f}."]
    else:  # refuse_cancel
        actions += ["I'm sorry, this order was delivered, so it cannot be cancelled."]
    return actions


def play(env, task_index, actions):
    obs, info = env.reset(options={"task_index": task_index})
    transcript = [obs]
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        transcript.append(obs)
        if terminated or truncated:
            return reward, terminated, info, transcript
    raise AssertionError(f"the episode did not end: {transcript}")


def test_check_env_passes(env):
    check_env(env.unwrapped, skip_render_check=True)


def test_tools_hide_the_episode_argument_and_the_policy_is_in_the_prompt(env):
    obs, info = env.reset(options={"task_index": 0})
    names = {t["function"]["name"] for t in info["tools"]}
    assert {"find_user_by_email", "get_order", "cancel_order", "change_address", "refund_order",
            "transfer_to_human_agents"} <= names  # fmt: skip
    assert all("episode" not in json.dumps(t) for t in info["tools"])
    assert "authenticate" in info["messages"][0]["content"] and obs == info["messages"][1]["content"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_correct_agent_with_the_scripted_user_gets_1(env, kind):
    k = first_of_kind(env, kind)
    instance = instances(env)[k]
    reward, terminated, info, transcript = play(env, k, correct_actions(instance, env.unwrapped.task.shop))
    assert (reward, terminated) == (1.0, True), (info["reward_info"], transcript)
    assert info["user_stop"] and "sim_error" not in info
    assert info["reward_info"]["db_match"] and info["reward_info"]["outputs_ok"]
    assert sum(m["role"] == "user" for m in info["messages"][2:]) >= 3  # the customer's replies


def _wrong(env, kind, replace):
    k = first_of_kind(env, kind)
    actions = correct_actions(instances(env)[k], env.unwrapped.task.shop)
    return k, [replace(a) for a in actions]


def test_wrong_action_sequences_get_0(env):
    shop = env.unwrapped.task.shop
    k, actions = _wrong(env, "cancel", lambda a: a.replace("no longer needed", "ordered by mistake")
                        if "cancel_order" in a and "no longer needed" in a else
                        a.replace("ordered by mistake", "no longer needed"))  # fmt: skip
    reward, _, info, _ = play(env, k, actions)
    assert reward == 0.0 and info["reward_info"]["tables_off_goal"] == ["orders"]

    k = first_of_kind(env, "refuse_cancel")  # the order was delivered: refunding it breaks the goal
    oid = instances(env)[k].metadata["facts"]["order_id"]
    actions = correct_actions(instances(env)[k], shop)[:4] + [
        call("refund_order", order_id=oid),
        "It has been refunded.",
    ]
    reward, _, info, _ = play(env, k, actions)
    assert reward == 0.0 and info["reward_info"]["tables_off_goal"] == ["orders", "refunds"]

    k, actions = _wrong(env, "total", lambda a: "The total of your order is $1.00." if "total" in a else a)
    reward, _, info, _ = play(env, k, actions)
    assert reward == 0.0 and info["reward_info"]["db_match"] and info["reward_info"]["missing_outputs"]

    k = first_of_kind(env, "address")  # no write at all: the goal needs one
    reward, _, info, _ = play(env, k, ["What is your email?", "Sorry, I am done here."])
    assert reward == 0.0 and info["reward_info"]["tables_off_goal"] == ["orders"]


def test_transfer_to_human_ends_the_episode_and_a_forged_episode_argument_is_ignored(env):
    k = first_of_kind(env, "cancel")
    other = next(o for o in generate_shop(0).orders if o.status == "pending").order_id
    forged = call("cancel_order", order_id=other, reason="no longer needed", episode="0" * 32)
    obs, info = env.reset(options={"task_index": k})
    obs, reward, terminated, truncated, info = env.step(forged)
    assert '"status": "cancelled"' in obs  # ran on this episode's own database, not a forged one
    obs, reward, terminated, truncated, info = env.step(
        call("transfer_to_human_agents", summary="needs help")
    )
    assert terminated and not truncated and "Transferred" in obs and reward == 0.0
    assert sorted(p.name for p in env.unwrapped.task.workdir.iterdir()) == ["template.sqlite"]


def test_64_envs_writing_at_once_never_see_each_others_writes():
    envs = gym.make_vec("RLF/CustomerService-v0", num_envs=64, autoreset_mode="Disabled")
    try:
        task = envs.unwrapped.task
        order = next(o for o in task.shop.orders if o.status == "pending")
        envs.reset(options={"task_indices": list(range(64))})
        actions = [
            call("cancel_order", order_id=order.order_id, reason="no longer needed") if i % 2 == 0
            else call("change_address", order_id=order.order_id, address=f"{i} Test Road, Velmora 10115")
            for i in range(64)
        ]  # fmt: skip
        obs, _, terminated, truncated, infos = envs.step(actions)  # 64 writes to one order, in one step
        assert not (terminated | truncated).any() and not any(infos["errors"])
        assert sum(1 for o in obs if '"status": "cancelled"' in o) == 32  # every cancel succeeded
        obs, *_ = envs.step([call("get_order", order_id=order.order_id)] * 64)
        for i, text in enumerate(obs):
            seen = json.loads(text.split("<tool_response>\n")[1].split("\n</tool_response>")[0])
            if i % 2 == 0:
                assert (seen["status"], seen["address"]) == ("cancelled", order.address), i
            else:
                assert (seen["status"], seen["address"]) == ("pending", f"{i} Test Road, Velmora 10115"), i
        assert len(list(task.workdir.glob("*.sqlite"))) == 65  # the template + one copy per episode
        envs.step(["Bye."] * 64)  # the scripted user answers; nobody stops on its first reply
        envs.reset(options={"task_indices": list(range(64))})
        assert len(list(task.workdir.glob("*.sqlite"))) == 65  # old copies removed, fresh ones made
    finally:
        envs.close()
    assert sorted(p.name for p in task.workdir.iterdir()) == ["template.sqlite"]


def test_shop_and_scenarios_are_deterministic_with_a_train_test_split():
    assert generate_shop(3) == generate_shop(3) and generate_shop(3) != generate_shop(4)
    assert make_scenarios(generate_shop(3), 3) == make_scenarios(generate_shop(3), 3)
    task = CustomerServiceTask(seed=1)
    train, test = task.instances("train"), task.instances("test")
    assert len(train) == 25 and len(test) == 5 and not {i.id for i in train} & {i.id for i in test}
    assert {i.metadata["kind"] for i in train} == set(KINDS)
    assert all(i.metadata["user_instructions"] and i.metadata["persona"] for i in train + test)
