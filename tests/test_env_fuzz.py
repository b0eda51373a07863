"""Hypothesis: no action, however malformed, makes an env raise or lose another env's result."""

import json

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlf_envs.core.vector import ToolVectorEnv
from rlf_envs.tasks.tool_use import make_tool_use_task
from rlf_envs.types import ErrorKind

TASKS = [{"question": f"q{i}", "answer": str(i)} for i in range(4)]


def echo(text: str, times: int = 1) -> str:
    """Repeat a text."""
    return text * times


names = st.sampled_from(["echo", "Echo", "", "nope", "echo ", "x" * 300])
argument_values = st.one_of(
    st.text(max_size=20), st.integers(-5, 10**6), st.none(), st.lists(st.integers(), max_size=3)
)
arguments = st.dictionaries(st.sampled_from(["text", "times", "extra", ""]), argument_values, max_size=3)


@st.composite
def actions(draw):
    kind = draw(st.sampled_from(["random", "near_valid", "broken_json", "mixed", "answer"]))
    if kind == "random":
        return draw(st.text(max_size=400))
    call = json.dumps({"name": draw(names), "arguments": draw(arguments)})
    if kind == "near_valid":
        return f"<tool_call>{call}</tool_call>" * draw(st.integers(1, 20))
    if kind == "broken_json":
        cut = draw(st.integers(0, len(call)))
        return f"<tool_call>{call[:cut]}</tool_call>"
    if kind == "mixed":
        return draw(st.text(max_size=50)) + f"<tool_call>{call}" + draw(st.text(max_size=50))
    return f"<answer>{draw(st.text(max_size=30))}</answer>"


ENVS = ToolVectorEnv(
    make_tool_use_task(tasks=TASKS, python_tools=[echo]), 4, max_result_chars=200, max_calls_per_turn=8
)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(actions(), min_size=4, max_size=4))
def test_vector_step_never_raises_and_keeps_every_result(batch):
    ENVS.reset(seed=0, options={"task_indices": [0, 1, 2, 3]})
    obs, rewards, terminated, truncated, infos = ENVS.step(batch)
    assert len(obs) == 4 and rewards.shape == (4,)
    known = {kind.value for kind in ErrorKind}
    for i in range(len(batch)):
        done = terminated[i] or truncated[i]
        if not done:
            assert obs[i].count("<tool_response>") == len(infos["tool_calls"][i]) >= 1
            assert set(infos["errors"][i]) <= known
            assert all(len(m["content"]) <= 200 for m in infos["tool_messages"][i])
        else:
            assert np.isfinite(rewards[i])
