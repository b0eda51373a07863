"""Check what a DeepSearch episode says about kinds against the generated world.

The kinds oracle (``deepsearch-oracle-kinds``) teaches two statements: "The question asks for a
capital." and "Sugli is a city, not a capital." / "Rega is a capital, as the question asks." The
task's ``kind_claim_cost`` charges each such statement the world contradicts: GRPO otherwise learned
to license an extra search with a claim like "Roril is a city, not a city proper", and the
episode reward alone never saw it. Sentences in any other wording are not judged.

Example:
    >>> from rlf_envs.tasks.deepsearch.oracle import oracle_turns
    >>> from rlf_envs.tasks.deepsearch.world_builder import generate_world
    >>> world = generate_world(0)
    >>> three = next(q for q in world.questions if q.hops == 3)
    >>> false_kind_claims(world, three.id, oracle_turns(world, three.id, style="kinds"))
    0
    >>> city = world.solve(three.id).queries[1]
    >>> false_kind_claims(world, three.id, [f"{city} is a city, not a city proper. I need to look up {city}."])
    1
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rlf_envs.tasks.deepsearch.oracle import RELATION_TARGET_KINDS
from rlf_envs.tasks.deepsearch.world import World

_ASKS = re.compile(r"(?:^|(?<=[.!?]\s))The question asks for an? (?P<asked>[a-z][a-z ]*?)\.", re.MULTILINE)
_IS = re.compile(
    r"(?:^|(?<=[.!?]\s))(?P<name>[A-Z][^.,\n]*?) is an? (?P<kind>[a-z][a-z ]*?), "
    r"(?:not an? (?P<other>[a-z][a-z ]*?)[.,]|(?P<as_asked>as the question asks)\.)",
    re.MULTILINE,
)


@functools.lru_cache(maxsize=4)
def _kinds_by_name(world: World) -> dict[str, frozenset[str]]:
    """Every entity name and alias -> the kinds the statements may give it ("capital" is a city
    that some country names as its capital)."""
    capitals = {e.relations["capital"] for e in world.entities.values() if "capital" in e.relations}
    kinds: dict[str, set[str]] = {}
    for entity in world.entities.values():
        own = {entity.kind, "capital"} if entity.id in capitals else {entity.kind}
        for name in entity.answer_names:
            kinds.setdefault(name, set()).update(own)
    return {name: frozenset(k) for name, k in kinds.items()}


def asked_kind(world: World, question_id: str) -> str:
    """The kind of thing a question asks for: where its last relation leads.

    Example:
        >>> from rlf_envs.tasks.deepsearch.world_builder import generate_world
        >>> world = generate_world(0)
        >>> question = next(q for q in world.questions if q.question.startswith("In which country"))
        >>> asked_kind(world, question.id)
        'country'
    """
    return RELATION_TARGET_KINDS[world.solve(question_id).relations[-1]]


def false_kind_claims(world: World, question_id: str, texts: Iterable[str]) -> int:
    """How many kind statements in ``texts`` (the assistant's turns) the world contradicts: a wrong
    kind asked for, an entity said to be a kind it is not (or a name the world does not know), "not a
    Q" with Q other than the kind asked for (or equal to the entity's stated kind), or "as the
    question asks" of a kind the question does not ask for."""
    asked = asked_kind(world, question_id)
    kinds = _kinds_by_name(world)
    false = 0
    for text in texts:
        false += sum(match["asked"] != asked for match in _ASKS.finditer(text))
        for match in _IS.finditer(text):
            stated = match["kind"]
            true_of_entity = stated in kinds.get(match["name"], frozenset())
            # "as the question asks" must name the asked kind; "not a Q" must set it against it
            as_asked = stated == asked
            consistent = as_asked if match["as_asked"] else match["other"] == asked and not as_asked
            false += not (true_of_entity and consistent)
    return false


def false_kind_claims_in_chat(world: World, question_id: str, messages: Sequence[Mapping[str, Any]]) -> int:
    """:func:`false_kind_claims` over the assistant turns of a chat (an episode's messages or a
    logged transcript).

    Example:
        >>> from rlf_envs.tasks.deepsearch.world_builder import generate_world
        >>> world = generate_world(0)
        >>> one = next(q for q in world.questions if q.hops == 1)
        >>> chat = [{"role": "user", "content": "Xy is a city, not a city."}, {"role": "assistant", "content": None}]
        >>> false_kind_claims_in_chat(world, one.id, chat)
        0
    """
    said = [str(m.get("content") or "") for m in messages if m.get("role") == "assistant"]
    return false_kind_claims(world, question_id, said)


__all__ = ["asked_kind", "false_kind_claims", "false_kind_claims_in_chat"]
