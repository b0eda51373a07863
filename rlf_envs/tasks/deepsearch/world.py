"""A procedurally generated multi-hop "world": fictional entities, one document each, and questions.

Everything comes from ``random.Random(seed)``, so a seed gives the byte-identical corpus and
questions on any machine, with nothing to download. Names are built from syllables and facts
are drawn at random, so a model cannot answer from pretraining: it has to search.

Entities and the relations the questions follow (each a function: one value per entity):

    city.located_in -> country         country.capital -> city (one of its own cities)
    person.born_in -> city             company.founded_by -> person
    company.headquartered_in -> city   invention.invented_by -> person
    river.rises_in -> city

Documents also state true but irrelevant facts (a person "later moved to" another city, a
river "flows through" other cities, twin towns, rivals, ...) as distractors. A question of
``h`` hops names one entity and follows ``h`` relations; each hop's fact is in the document of
the entity the hop starts from, so answering it takes ``h`` searches.

The world is built by :func:`~rlf_envs.tasks.deepsearch.world_builder.generate_world`; this
module holds what it is made of and what can be asked of it.

Example:
    >>> from rlf_envs.tasks.deepsearch.world_builder import generate_world
    >>> world = generate_world(seed=0)
    >>> question = world.split("test")[0]
    >>> solution = world.solve(question.id)
    >>> len(solution.queries) == question.hops and solution.answer == question.golden_answers[0]
    True
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from rlf_envs.rewards.rules import normalize_answer
from rlf_envs.tasks.deepsearch.data import Document, corpus_hash
from rlf_envs.types import TaskInstance

SPLITS = ("train", "test")


class WorldConsistencyError(ValueError):
    """The generated world breaks an invariant (ambiguous name, unstated fact, ...)."""


@dataclass(frozen=True)
class WorldConfig:
    """How big a world to generate. The defaults give ~2.9k documents and ~3k questions."""

    countries: int = 40
    cities: int = 400
    persons: int = 1500
    companies: int = 500
    inventions: int = 300
    rivers: int = 120
    questions_per_hop: int = 1000
    test_fraction: float = 0.1


@dataclass(frozen=True, eq=False)
class Entity:
    """A thing in the world. ``id`` is also the id of its document."""

    id: str
    kind: str
    name: str
    aliases: tuple[str, ...] = ()
    relations: dict[str, str] = field(default_factory=dict)  # relation -> entity id

    @property
    def answer_names(self) -> list[str]:
        return [self.name, *self.aliases]


@dataclass(frozen=True)
class Question:
    """A question, its accepted answers and the documents (one per hop) that support it."""

    id: str
    question: str
    golden_answers: tuple[str, ...]
    hops: int
    supporting_doc_ids: tuple[str, ...]
    template: str
    split: str

    def to_record(self) -> dict[str, object]:
        """A JSON line in the Search-R1 QA shape (``question``, ``golden_answers``) plus our fields."""
        return {
            "id": self.id,
            "question": self.question,
            "golden_answers": list(self.golden_answers),
            "hops": self.hops,
            "supporting_doc_ids": list(self.supporting_doc_ids),
            "template": self.template,
            "split": self.split,
        }


class OracleSolution(NamedTuple):
    """What an oracle agent does: search each entity name along the chain, then answer.

    ``relations``: the relation each hop follows (``queries[i]``'s document states
    ``relations[i]``, which leads to ``queries[i + 1]`` or, at the last hop, to the answer).
    """

    queries: list[str]
    answer: str
    relations: tuple[str, ...] = ()


@dataclass(frozen=True)
class ChainTemplate:
    """A question shape: start at an entity of ``start_kind`` and follow ``relations``."""

    name: str
    start_kind: str
    relations: tuple[str, ...]
    text: str  # "{name}" is the start entity's name


# One fact phrase per relation: the document of the hop's source entity says
# "<phrase><target name>" exactly once, which World.check verifies.
RELATION_PHRASES = {
    "located_in": "is a city in ",
    "capital": "Its capital city is ",
    "born_in": "was born in ",
    "founded_by": "It was founded by ",
    "headquartered_in": "is headquartered in ",
    "invented_by": "invented by ",
    "rises_in": "rises near ",
}

CHAIN_TEMPLATES = (
    ChainTemplate("person_city", "person", ("born_in",), "In which city was {name} born?"),
    ChainTemplate("city_country", "city", ("located_in",), "In which country is {name} located?"),
    ChainTemplate("country_capital", "country", ("capital",), "What is the capital of {name}?"),
    ChainTemplate("company_founder", "company", ("founded_by",), "Who founded {name}?"),
    ChainTemplate("company_hq", "company", ("headquartered_in",), "In which city is {name} headquartered?"),
    ChainTemplate("invention_inventor", "invention", ("invented_by",), "Who invented the {name}?"),
    ChainTemplate("river_source", "river", ("rises_in",), "Near which city does the {name} rise?"),
    ChainTemplate("person_country", "person", ("born_in", "located_in"), "In which country was {name} born?"),
    ChainTemplate(
        "city_capital",
        "city",
        ("located_in", "capital"),
        "What is the capital of the country in which {name} is located?",
    ),
    ChainTemplate(
        "company_founder_city",
        "company",
        ("founded_by", "born_in"),
        "In which city was the founder of {name} born?",
    ),
    ChainTemplate(
        "company_hq_country",
        "company",
        ("headquartered_in", "located_in"),
        "In which country is {name} headquartered?",
    ),
    ChainTemplate(
        "invention_inventor_city",
        "invention",
        ("invented_by", "born_in"),
        "In which city was the inventor of the {name} born?",
    ),
    ChainTemplate(
        "river_source_country", "river", ("rises_in", "located_in"), "In which country does the {name} rise?"
    ),
    ChainTemplate(
        "person_capital",
        "person",
        ("born_in", "located_in", "capital"),
        "What is the capital of the country where {name} was born?",
    ),
    ChainTemplate(
        "company_founder_country",
        "company",
        ("founded_by", "born_in", "located_in"),
        "In which country was the founder of {name} born?",
    ),
    ChainTemplate(
        "company_hq_capital",
        "company",
        ("headquartered_in", "located_in", "capital"),
        "What is the capital of the country where {name} is headquartered?",
    ),
    ChainTemplate(
        "invention_inventor_country",
        "invention",
        ("invented_by", "born_in", "located_in"),
        "In which country was the inventor of the {name} born?",
    ),
    ChainTemplate(
        "river_source_capital",
        "river",
        ("rises_in", "located_in", "capital"),
        "What is the capital of the country where the {name} rises?",
    ),
)

_TEMPLATES_BY_NAME = {template.name: template for template in CHAIN_TEMPLATES}


class World:
    """A generated world: entities, their documents, and questions split into train and test.

    Build one with :func:`~rlf_envs.tasks.deepsearch.world_builder.generate_world`. Treat it as read-only.
    """

    def __init__(
        self,
        seed: int,
        config: WorldConfig,
        entities: dict[str, Entity],
        documents: list[Document],
        questions: list[Question],
    ) -> None:
        self.seed = seed
        self.config = config
        self.entities = entities
        self.documents = documents
        self.questions = questions
        self._questions_by_id = {q.id: q for q in questions}
        self._documents_by_id = {d.id: d for d in documents}

    def __repr__(self) -> str:
        return f"World(seed={self.seed}, documents={len(self.documents)}, questions={len(self.questions)})"

    def split(self, name: str) -> list[Question]:
        """The questions of ``"train"`` or ``"test"``."""
        if name not in SPLITS:
            raise KeyError(f"unknown split {name!r}; the world has {list(SPLITS)}")
        return [q for q in self.questions if q.split == name]

    def question(self, question_id: str) -> Question:
        try:
            return self._questions_by_id[question_id]
        except KeyError:
            raise KeyError(f"no question {question_id!r} in {self!r}") from None

    def document(self, doc_id: str) -> Document:
        return self._documents_by_id[doc_id]

    def solve(self, question_id: str) -> OracleSolution:
        """The searches an oracle agent issues (the name of each hop's source entity) and the answer.

        Example:
            >>> from rlf_envs.tasks.deepsearch.world_builder import generate_world
            >>> world = generate_world(seed=0)
            >>> q = next(q for q in world.questions if q.hops == 2)
            >>> world.solve(q.id).queries == [world.entities[d].name for d in q.supporting_doc_ids]
            True
        """
        question = self.question(question_id)
        queries = [self.entities[doc_id].name for doc_id in question.supporting_doc_ids]
        relations = _TEMPLATES_BY_NAME[question.template].relations
        return OracleSolution(queries=queries, answer=question.golden_answers[0], relations=relations)

    def to_instances(self, split: str) -> list[TaskInstance]:
        """The questions of a split as task instances (``answer`` = list of golden answers)."""
        return [
            TaskInstance(
                id=q.id,
                question=q.question,
                answer=list(q.golden_answers),
                metadata={
                    "hops": q.hops,
                    "supporting_doc_ids": list(q.supporting_doc_ids),
                    "template": q.template,
                    "world_seed": self.seed,
                },
            )
            for q in self.split(split)
        ]

    def corpus_hash(self) -> str:
        """Hash of the documents alone: what a search index built from this world records."""
        return corpus_hash(self.documents)

    def content_hash(self) -> str:
        """Hash of documents and questions: equal across machines for equal seed and config."""
        digest = hashlib.sha256(self.corpus_hash().encode())
        for question in self.questions:
            digest.update(
                json.dumps(question.to_record(), sort_keys=True, ensure_ascii=False).encode("utf-8")
            )
            digest.update(b"\n")
        return digest.hexdigest()

    def write_corpus(self, path: str | Path) -> Path:
        """Write the documents as a FlashRAG/Search-R1 corpus JSONL (``id``, ``contents``)."""
        path = Path(path)
        with path.open("w", encoding="utf-8") as out:
            for document in self.documents:
                out.write(json.dumps(document.to_record(), ensure_ascii=False) + "\n")
        return path

    def write_questions(self, path: str | Path, split: str) -> Path:
        """Write a split's questions as QA JSONL (``question``, ``golden_answers``, ...)."""
        path = Path(path)
        with path.open("w", encoding="utf-8") as out:
            for question in self.split(split):
                out.write(json.dumps(question.to_record(), ensure_ascii=False) + "\n")
        return path

    def check(self) -> None:
        """Raise :class:`WorldConsistencyError` unless every question has one unambiguous answer.

        Checks: names and aliases are unique after answer normalisation (so EM cannot confuse two
        entities); each hop's fact is stated exactly once in its supporting document; following
        the relations gives the golden answer; the answer is not named in the question.
        """
        owner_of_name: dict[str, str] = {}
        for entity in self.entities.values():
            for name in entity.answer_names:
                key = normalize_answer(name)
                if owner_of_name.setdefault(key, entity.id) != entity.id:
                    raise WorldConsistencyError(
                        f"name {name!r} is shared by {owner_of_name[key]} and {entity.id}"
                    )
        texts: set[str] = set()
        for question in self.questions:
            if question.question in texts:
                raise WorldConsistencyError(f"question text repeated: {question.question!r}")
            texts.add(question.question)
            self._check_question(question)

    def _check_question(self, question: Question) -> None:
        template = _TEMPLATES_BY_NAME[question.template]
        if question.hops != len(template.relations) or len(question.supporting_doc_ids) != question.hops:
            raise WorldConsistencyError(f"{question.id}: hops do not match its template")
        current = self.entities[question.supporting_doc_ids[0]]
        if current.name not in question.question:
            raise WorldConsistencyError(f"{question.id}: question does not name {current.name!r}")
        for hop, relation in enumerate(template.relations):
            if current.id != question.supporting_doc_ids[hop]:
                raise WorldConsistencyError(f"{question.id}: hop {hop} document is not {current.id}")
            target = self.entities[current.relations[relation]]
            text = self.document(current.id).text
            phrase = RELATION_PHRASES[relation]
            if text.count(phrase) != 1 or phrase + target.name not in text:
                raise WorldConsistencyError(f"{question.id}: {current.id} does not state {relation} once")
            current = target
        if list(question.golden_answers) != current.answer_names:
            raise WorldConsistencyError(
                f"{question.id}: golden answers {question.golden_answers} != {current.name}"
            )
        padded_question = f" {normalize_answer(question.question)} "
        if any(f" {normalize_answer(name)} " in padded_question for name in current.answer_names):
            raise WorldConsistencyError(f"{question.id}: the answer appears in the question")
