"""The DeepSearch oracle: a scripted agent that searches each entity along a question's chain, then answers.

It reads the generated world's own solution (the queries that reach each hop's document and the
golden answer), so on the generated world it scores 1.0 wherever the search server returns the
hop's document. Its turns are written in the canonical ``<tool_call>`` form that
:func:`rlf_trainer.rollout.chat.plain_messages` renders, so a collected episode replays token for token
(:mod:`rlf_trainer.data.demonstrations`, ``rlf-collect --agent deepsearch-oracle``).

``max_hops`` caps the searches: with ``max_hops=2`` it solves 1- and 2-hop questions and never a
3-hop one (it answers after its second search with the entity that search led to, which is never
the answer: the world keeps a question's answer out of its chain). Demonstrations then show at
most two searches, for rlf-collect (``--max-hops``) and for GRPO guidance
(``algorithm.guidance.max_hops``) alike.

Example:
    >>> from rlf_envs.tasks.deepsearch.world_builder import generate_world
    >>> world = generate_world(0)
    >>> question = next(q for q in world.questions if q.hops == 2)
    >>> turns = oracle_turns(world, question.id)
    >>> len(turns), turns[-1].startswith("The documents give the answer.")
    (3, True)
    >>> three = next(q for q in world.questions if q.hops == 3)
    >>> limited = oracle_turns(world, three.id, max_hops=2)
    >>> len(limited), three.golden_answers[0] in limited[-1]
    (3, False)
    >>> three_turns = oracle_turns(world, three.id, style="kinds")
    >>> print(three.question, *(turn.split("\\n")[0] for turn in three_turns), sep="\\n")
    What is the capital of the country where Tivi Keveir was born?
    The question asks for a capital. I need to look up Tivi Keveir.
    Sugli is a city, not a capital. I need to look up Sugli.
    Neky is a country, not a capital. I need to look up Neky.
    Rega is a capital, as the question asks.
    >>> agent = DeepSearchOracle(world_seed=0)
    >>> agent([{"role": "system", "content": ""}, {"role": "user", "content": "?"}],
    ...       {"task_id": question.id}) == turns[0]
    True
"""

from __future__ import annotations

import json
from typing import Any

from rlf_envs.tasks.deepsearch.world import World
from rlf_envs.tasks.deepsearch.world_builder import generate_world


def search_call(query: str) -> str:
    """One ``search`` call as a ``<tool_call>`` block (the env's default Hermes/Qwen parser reads it)."""
    payload = {"name": "search", "arguments": {"query": query}}
    return f"<tool_call>\n{json.dumps(payload, ensure_ascii=False)}\n</tool_call>"


# What each relation leads to, in the words the kinds style writes. "capital" is its own kind:
# a chain can pass a city (born in) on its way to a capital, and must not stop there.
RELATION_TARGET_KINDS = {
    "born_in": "city",
    "headquartered_in": "city",
    "rises_in": "city",
    "located_in": "country",
    "capital": "capital",
    "founded_by": "person",
    "invented_by": "person",
}
ORACLE_STYLES = ("plain", "kinds")
# the scripted agents' names (rlf-collect --agent, algorithm.guidance.demonstrator) -> style
ORACLE_AGENTS = {"deepsearch-oracle": "plain", "deepsearch-oracle-kinds": "kinds"}


def oracle_turns(
    world: World, question_id: str, max_hops: int | None = None, style: str = "plain"
) -> list[str]:
    """The oracle's assistant turns for one question: one search per hop, then the answer.

    With ``max_hops`` below the question's hops it searches ``max_hops`` times and answers with
    the entity its last search led to (the next entity of the chain, not the answer).
    ``style="plain"`` says only what it looks up; ``style="kinds"`` first says what kind of thing
    the question asks for (person, city, country, capital) and, after each search, what kind the
    entity it found is: it searches again while the two differ, a rule that also covers questions
    with more hops than any demonstration shows.
    """
    if max_hops is not None and max_hops < 1:
        raise ValueError(f"max_hops must be >= 1 (or None), got {max_hops}")
    if style not in ORACLE_STYLES:
        raise ValueError(f"style must be one of {ORACLE_STYLES}, got {style!r}")
    solution = world.solve(question_id)
    queries = solution.queries[:max_hops] if max_hops is not None else solution.queries
    # past the limit, the name the last search found is all the oracle knows
    answer = solution.answer if len(queries) == len(solution.queries) else solution.queries[len(queries)]
    if style == "plain":
        turns = [f"I need to look up {q}.\n{search_call(q)}" for q in queries]
        return [*turns, f"The documents give the answer.\n<answer>{answer}</answer>"]
    kinds = [RELATION_TARGET_KINDS[relation] for relation in solution.relations]
    asked = kinds[-1]
    turns = [f"The question asks for a {asked}. I need to look up {queries[0]}.\n{search_call(queries[0])}"]
    for hop, query in enumerate(queries[1:]):
        turns.append(
            f"{query} is a {kinds[hop]}, not a {asked}. I need to look up {query}.\n{search_call(query)}"
        )
    found_kind = kinds[len(queries) - 1]
    verdict = (
        "as the question asks" if found_kind == asked else f"not a {asked}, but the search limit is reached"
    )
    return [*turns, f"{answer} is a {found_kind}, {verdict}.\n<answer>{answer}</answer>"]


class DeepSearchOracle:
    """A scripted agent: ``agent(messages, info) -> next assistant turn`` for the generated world.

    ``info["task_id"]`` names the question (the reset info carries it); the number of assistant
    turns already in ``messages`` says which of :func:`oracle_turns` comes next. ``max_hops``: at
    most this many searches (None: as many as the question has hops).
    """

    def __init__(self, world_seed: int = 0, max_hops: int | None = None, style: str = "plain") -> None:
        if max_hops is not None and max_hops < 1:
            raise ValueError(f"max_hops must be >= 1 (or None), got {max_hops}")
        if style not in ORACLE_STYLES:
            raise ValueError(f"style must be one of {ORACLE_STYLES}, got {style!r}")
        self.world = generate_world(world_seed)
        self.max_hops = max_hops
        self.style = style

    def __call__(self, messages: list[dict[str, Any]], info: dict[str, Any]) -> str:
        turns = oracle_turns(self.world, str(info["task_id"]), self.max_hops, self.style)
        done = sum(1 for m in messages if m.get("role") == "assistant")
        return turns[min(done, len(turns) - 1)]


__all__ = [
    "ORACLE_AGENTS",
    "ORACLE_STYLES",
    "RELATION_TARGET_KINDS",
    "DeepSearchOracle",
    "oracle_turns",
    "search_call",
]
