"""The codebook task: look a word's secret code up with the ``lookup`` tool, then say the code.

A tool task small enough for SmolLM2-135M-Instruct to improve on in ~20 GRPO steps on a CPU. The
code cannot be guessed (1 in ~9000), so a right answer needs a successful tool call followed by
reading the code off its result. The system prompt shows the call and answer format once; each
question ends with the exact call to make (see :mod:`rlf_envs.tasks.codebook.data`).

Reward (fixed before any training run; see docs/learning.md):

===============================================================  ======
episode                                                          reward
===============================================================  ======
the final reply states the right code (``acc``)                  1.0
else: a successful lookup of the asked word (``tool_ok``)        0.3
else                                                             0.0
===============================================================  ======

"States the right code": the reply's ``<answer>`` content if it has one, else the whole final reply
of an episode that ended by answering (not one cut off while still calling tools), contains at
least one number and every number in it is the code. SmolLM2-135M never wrote ``<answer>`` tags
in our base-rate samples but often wrote the code as plain text or in other tags, so the tag is
not required; ``answer_tag`` reports whether it was used. ``reward_info`` keeps every part apart
(``acc``, ``tool_ok``, ``tool_called``, ``answer_tag``) so that format gains are never read as
accuracy: the trainer's ``accuracy`` metric is ``acc``.

Use it through ``RLF/ToolUse-v0`` (``examples/configs/smollm2_learn_cpu.yaml`` names these objects):

Example:
    >>> import gymnasium as gym, rlf_envs
    >>> env = gym.make("RLF/ToolUse-v0", **tool_use_kwargs(), max_turns=2)
    >>> obs, info = env.reset(seed=0, options={"task_index": 0})
    >>> word = env.unwrapped.task.instances("train")[0].metadata["word"]
    >>> call = '<tool_call>{"name": "lookup", "arguments": {"word": "%s"}}</tool_call>' % word
    >>> code = env.step(call)[0].split()[1]
    >>> env.step(f"<answer>{code}</answer>")[1]
    1.0
    >>> env.close()
"""

from __future__ import annotations

import re
from typing import Any

from rlf_envs.answers import extract_answer
from rlf_envs.tasks.codebook.data import (
    DEFAULT_SEED,
    EXAMPLE_CODE,
    EXAMPLE_WORD,
    make_codebook,
    make_task_records,
)
from rlf_envs.types import Episode

TOOL_NAME = "lookup"
CORRECT_REWARD = 1.0
TOOL_REWARD = 0.3  # a successful lookup of the asked word, when the code was not stated

SYSTEM_PROMPT = f"""\
You find secret codes. You do not know any code. To get the code of a word, call the lookup tool \
like this:
<tool_call>{{"name": "{TOOL_NAME}", "arguments": {{"word": "{EXAMPLE_WORD}"}}}}</tool_call>
The tool then gives you the code, and you reply with it like this: <answer>{EXAMPLE_CODE}</answer>"""

CODEBOOK: dict[str, str] = make_codebook(DEFAULT_SEED)
_RECORDS = make_task_records(DEFAULT_SEED)
TRAIN_TASKS: list[dict[str, Any]] = _RECORDS["train"]
TEST_TASKS: list[dict[str, Any]] = _RECORDS["test"]

_NUMBER = re.compile(r"\d+")


def _normalize_word(word: str) -> str:
    return word.strip().strip("'\"` ").lower()


def lookup(word: str) -> str:
    """Look up the secret code of a word.

    Args:
        word: the word
    """
    code = CODEBOOK.get(_normalize_word(word))
    if code is None:
        raise KeyError(f"no secret code for {word!r}")
    return code


def stated_answer(episode: Episode) -> str | None:
    """The text whose numbers count as the episode's answer (see the module docstring), or None.

    Example:
        >>> from rlf_envs.types import Episode, TaskInstance
        >>> def ended(reply, terminated=True):
        ...     return Episode(TaskInstance("0", "q"), [], reply, None, [], 1, terminated, not terminated)
        >>> stated_answer(ended("<answer>12</answer> or 13")), stated_answer(ended("It is 12."))
        ('12', 'It is 12.')
        >>> stated_answer(ended("12, then a tool call", terminated=False)) is None   # cut off mid-turn
        True
    """
    tagged = extract_answer(episode.final_response)
    if tagged is not None:
        return tagged
    return episode.final_response if episode.terminated else None


def states_code(text: str | None, code: str) -> bool:
    """Whether ``text`` contains a number and every number in it is ``code``.

    Example:
        >>> states_code("The code is 9725.", "9725"), states_code("9725 or 1234", "9725"), states_code("none", "9725")
        (True, False, False)
    """
    numbers = _NUMBER.findall(text or "")
    return bool(numbers) and all(number == code for number in numbers)


def codebook_reward(episode: Episode) -> dict[str, float]:
    """The reward of the module docstring, with its parts in ``reward_info``.

    Example:
        >>> from rlf_envs.types import Episode, TaskInstance
        >>> task = TaskInstance("0", "What is the code of apple?", "9725", {"word": "apple"})
        >>> lookup_call = {"name": "lookup", "arguments": {"word": "apple"}, "ok": True}
        >>> def ended(reply):
        ...     return Episode(task, [], reply, None, [lookup_call], 2, terminated=True, truncated=False)
        >>> codebook_reward(ended("It is 1234."))   # looked up, then stated the wrong code
        {'reward': 0.3, 'acc': 0.0, 'tool_ok': 1.0, 'tool_called': 1.0, 'answer_tag': 0.0}
        >>> codebook_reward(ended("<answer>9725</answer>"))["reward"]
        1.0
    """
    word = _normalize_word(str(episode.instance.metadata.get("word", "")))
    correct = states_code(stated_answer(episode), str(episode.instance.answer))
    tool_ok = any(
        call["name"] == TOOL_NAME
        and call["ok"]
        and _normalize_word(str(call["arguments"].get("word", ""))) == word
        for call in episode.tool_calls
    )
    reward = CORRECT_REWARD if correct else TOOL_REWARD if tool_ok else 0.0
    return {
        "reward": reward,
        "acc": float(correct),
        "tool_ok": float(tool_ok),
        "tool_called": float(bool(episode.tool_calls)),
        "answer_tag": float(extract_answer(episode.final_response) not in (None, "")),
    }


def tool_use_kwargs() -> dict[str, Any]:
    """The ``RLF/ToolUse-v0`` kwargs of this task, for Python callers (YAML configs name the same objects).

    Example:
        >>> sorted(tool_use_kwargs())
        ['name', 'python_tools', 'reward', 'system_prompt', 'tasks', 'test_tasks']
    """
    return {
        "tasks": TRAIN_TASKS,
        "test_tasks": TEST_TASKS,
        "reward": codebook_reward,
        "python_tools": [lookup],
        "system_prompt": SYSTEM_PROMPT,
        "name": "codebook",
    }
