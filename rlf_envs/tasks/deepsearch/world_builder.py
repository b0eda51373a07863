"""Building a DeepSearch world from a seed: names, documents and questions, all from one RNG.

:func:`generate_world` draws the entities of :mod:`rlf_envs.tasks.deepsearch.world` with
syllable-built names (never a prose word, so no name is ambiguous with the text around it), writes
one document per entity stating its facts among distractors, and picks the questions along
:data:`~rlf_envs.tasks.deepsearch.world.CHAIN_TEMPLATES`.

Example:
    >>> world = generate_world(seed=0)
    >>> sorted({q.hops for q in world.questions})
    [1, 2, 3]
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Iterable, Sequence

from rlf_envs.tasks.deepsearch.data import Document
from rlf_envs.tasks.deepsearch.tokens import STOPWORDS, tokenize
from rlf_envs.tasks.deepsearch.world import (
    CHAIN_TEMPLATES,
    RELATION_PHRASES,
    ChainTemplate,
    Entity,
    Question,
    World,
    WorldConfig,
)

# --- vocabulary for prose ---------------------------------------------------------------------

# Simple consonants and vowels are listed more than once so short, pronounceable names dominate.
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "b", "d", "k", "l", "m", "n", "r", "s", "t", "v", "br", "dr", "kr", "tr", "th", "sh", "st", "gl")  # fmt: skip
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "i", "o", "a", "ia", "ei", "ou", "y")
_CODAS = ("n", "r", "l", "s", "th", "m", "x", "nd", "rk")
_GOVERNMENTS = ("Republic", "Kingdom", "Federation", "Commonwealth", "Principality", "Grand Duchy")
_COUNTRY_KINDS = (
    "a mountainous",
    "a coastal",
    "a landlocked",
    "a small island",
    "a densely populated",
    "an arid",
)
_EXPORTS = ("copper", "wool", "amber", "salt", "tea", "timber", "glassware", "spices", "horses", "silver", "porcelain", "dyed cloth")  # fmt: skip
_CITY_FEATURES = ("a busy harbour", "an old university", "a famous clock tower", "terraced vineyards", "a large textile market", "a fortified old town", "its many bridges", "a yearly lantern festival")  # fmt: skip
_OCCUPATIONS = ("engineer", "chemist", "architect", "merchant", "physician", "painter", "cartographer", "astronomer", "composer", "shipwright", "botanist", "mathematician")  # fmt: skip
_DEEDS = ("a series of influential essays", "careful surveys of the coastline", "a widely copied method of glassmaking", "several public buildings", "a treatise on tides", "an early star catalogue", "reforms of the local hospitals", "a collection of folk songs")  # fmt: skip
_INDUSTRIES = ("shipbuilding", "textile", "mining", "printing", "brewing", "railway", "optics", "clockmaking", "chemicals", "insurance")  # fmt: skip
_COMPANY_SUFFIXES = ("Works", "Industries", "Holdings", "Foundry", "Dynamics", "Trading", "Mills", "Instruments", "Shipyards", "Company")  # fmt: skip
_DEVICES = ("loom", "lamp", "compass", "engine", "press", "valve", "clock", "lens", "pump", "kiln", "sextant", "telegraph", "furnace", "plough", "barometer")  # fmt: skip
_PURPOSES = ("weaving cloth faster", "measuring the depth of harbours", "lighting mine shafts", "keeping time at sea", "pumping water out of quarries", "printing maps", "drying grain", "sending messages across valleys")  # fmt: skip

_MIN_NAME_LENGTH = 4
# Words the prose uses: a name equal to one of them (or to a stopword) would be hard to search for.
_PROSE_WORDS = (
    "officially known country capital city shares border inhabitants twinned flows through later moved where "
    "spent most career corresponded years with best remembered company founded headquartered also runs branch "
    "office main rival device invented early models were built still shown museums today river rises near "
    "reaching sea about kilometres long who was born what which"
)


def _reserved_words() -> frozenset[str]:
    texts = [_PROSE_WORDS, *RELATION_PHRASES.values(), *(t.text for t in CHAIN_TEMPLATES)]
    for vocabulary in (_GOVERNMENTS, _COUNTRY_KINDS, _EXPORTS, _CITY_FEATURES, _OCCUPATIONS, _DEEDS, _INDUSTRIES,
                       _COMPANY_SUFFIXES, _DEVICES, _PURPOSES):  # fmt: skip
        texts.extend(vocabulary)
    return frozenset(tokenize(" ".join(texts))) | STOPWORDS


class _NameMaker:
    """Unique syllable words: no two entities (bar persons' first names) share a name token."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        # membership tests only, never iterated: iteration order of a set of str varies between runs
        self._used: set[str] = set(_reserved_words())

    def word(self, min_syllables: int = 2, max_syllables: int = 3) -> str:
        rng = self._rng
        while True:
            syllables = min_syllables if rng.random() < 0.7 else rng.randint(min_syllables, max_syllables)
            word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables))
            if rng.random() < 0.5:
                word += rng.choice(_CODAS)
            if len(word) >= _MIN_NAME_LENGTH and word not in self._used:
                self._used.add(word)
                return word.capitalize()


def _article(noun_phrase: str) -> str:
    return ("an " if noun_phrase[0].lower() in "aeiou" else "a ") + noun_phrase


class _Builder:
    """Draws entities, writes their documents and picks questions, all from one RNG."""

    def __init__(self, seed: int, config: WorldConfig) -> None:
        self.seed = seed
        self.config = config
        self.rng = random.Random(seed)
        self.names = _NameMaker(self.rng)
        self.entities: dict[str, Entity] = {}
        self.by_kind: dict[str, list[Entity]] = {}

    def _add(self, kind: str, index: int, name: str, aliases: Sequence[str] = (), **relations: str) -> Entity:
        entity = Entity(
            id=f"{kind}-{index:04d}", kind=kind, name=name, aliases=tuple(aliases), relations=relations
        )
        self.entities[entity.id] = entity
        self.by_kind.setdefault(kind, []).append(entity)
        return entity

    def _pick(self, kind: str, *, exclude: Iterable[str] = ()) -> Entity:
        excluded = set(exclude)
        while True:
            entity = self.rng.choice(self.by_kind[kind])
            if entity.id not in excluded:
                return entity

    def build_entities(self) -> None:
        config, rng, names = self.config, self.rng, self.names
        for i in range(config.countries):
            name = names.word(2, 3)
            self._add("country", i, name, aliases=[f"{rng.choice(_GOVERNMENTS)} of {name}"])
        countries = self.by_kind["country"]
        for i in range(config.cities):
            # the first pass gives every country a city, so every country can have a capital
            country = countries[i] if i < len(countries) else rng.choice(countries)
            self._add("city", i, names.word(2, 3), located_in=country.id)
        cities_of: dict[str, list[Entity]] = {}
        for city in self.by_kind["city"]:
            cities_of.setdefault(city.relations["located_in"], []).append(city)
        for country in countries:
            country.relations["capital"] = rng.choice(cities_of[country.id]).id
        first_names = [names.word(2, 2) for _ in range(max(20, config.persons // 10))]
        for i in range(config.persons):
            surname = names.word(2, 3)
            born_in = self._pick("city")
            self._add(
                "person", i, f"{rng.choice(first_names)} {surname}", aliases=[surname], born_in=born_in.id
            )
        for i in range(config.companies):
            name = f"{names.word(2, 3)} {rng.choice(_COMPANY_SUFFIXES)}"
            self._add(
                "company", i, name, founded_by=self._pick("person").id, headquartered_in=self._pick("city").id
            )
        for i in range(config.inventions):
            name = f"{names.word(2, 3)} {rng.choice(_DEVICES)}"
            self._add("invention", i, name, invented_by=self._pick("person").id)
        for i in range(config.rivers):
            self._add("river", i, f"{names.word(2, 3)} River", rises_in=self._pick("city").id)

    # --- documents ---------------------------------------------------------------------------

    def _name(self, entity_id: str) -> str:
        return self.entities[entity_id].name

    def build_documents(self) -> list[Document]:
        rivers_through: dict[str, list[str]] = {}
        river_courses: dict[str, list[str]] = {}
        for river in self.by_kind["river"]:
            course = [self._pick("city", exclude=[river.relations["rises_in"]]).id for _ in range(2)]
            if course[0] == course[1]:
                course = course[:1]
            river_courses[river.id] = course
            for city_id in course:
                rivers_through.setdefault(city_id, []).append(river.name)
        writers = {
            "country": self._country_text,
            "city": lambda e: self._city_text(e, rivers_through.get(e.id, [])),
            "person": self._person_text,
            "company": self._company_text,
            "invention": self._invention_text,
            "river": lambda e: self._river_text(e, river_courses[e.id]),
        }
        documents = []
        for entity in self.entities.values():
            sentences = writers[entity.kind](entity)
            documents.append(Document(id=entity.id, title=entity.name, text=" ".join(sentences)))
        return documents

    def _country_text(self, e: Entity) -> list[str]:
        rng = self.rng
        sentences = [
            f"{e.name}, officially the {e.aliases[0]}, is {rng.choice(_COUNTRY_KINDS)} country.",
            f"{RELATION_PHRASES['capital']}{self._name(e.relations['capital'])}.",
            f"{e.name} is known for its {rng.choice(_EXPORTS)}.",
        ]
        if rng.random() < 0.7:
            neighbour = self._pick("country", exclude=[e.id])
            sentences.append(f"{e.name} shares a border with {neighbour.name}.")
        return sentences

    def _city_text(self, e: Entity, rivers: list[str]) -> list[str]:
        rng = self.rng
        sentences = [
            f"{e.name} {RELATION_PHRASES['located_in']}{self._name(e.relations['located_in'])}.",
            f"{e.name} is known for {rng.choice(_CITY_FEATURES)} and has about {rng.randrange(5, 900) * 1000:,} inhabitants.",
        ]
        sentences += [f"The {river} flows through {e.name}." for river in rivers]
        if rng.random() < 0.4:
            sentences.append(f"{e.name} is twinned with {self._pick('city', exclude=[e.id]).name}.")
        return sentences

    def _person_text(self, e: Entity) -> list[str]:
        rng = self.rng
        subject, possessive = rng.choice((("She", "her"), ("He", "his")))
        surname = e.aliases[0]
        birth_year = rng.randrange(1700, 1960)
        sentences = [
            f"{e.name} was {_article(rng.choice(_OCCUPATIONS))} who {RELATION_PHRASES['born_in']}"
            f"{self._name(e.relations['born_in'])} in {birth_year}.",
            f"{subject} is best remembered for {rng.choice(_DEEDS)}.",
        ]
        if rng.random() < 0.6:
            elsewhere = self._pick("city", exclude=[e.relations["born_in"]])
            sentences.append(
                f"{surname} later moved to {elsewhere.name}, where {subject.lower()} spent most of {possessive} career."
            )
        if rng.random() < 0.3:
            sentences.append(
                f"{subject} corresponded for years with {self._pick('person', exclude=[e.id]).name}."
            )
        return sentences

    def _company_text(self, e: Entity) -> list[str]:
        rng = self.rng
        sentences = [
            f"{e.name} is {_article(rng.choice(_INDUSTRIES))} company.",
            f"{RELATION_PHRASES['founded_by']}{self._name(e.relations['founded_by'])} in {rng.randrange(1750, 2000)}.",
            f"{e.name} {RELATION_PHRASES['headquartered_in']}{self._name(e.relations['headquartered_in'])}.",
        ]
        if rng.random() < 0.4:
            sentences.append(f"Its main rival is {self._pick('company', exclude=[e.id]).name}.")
        if rng.random() < 0.4:
            branch = self._pick("city", exclude=[e.relations["headquartered_in"]])
            sentences.append(f"It also runs a branch office in {branch.name}.")
        return sentences

    def _invention_text(self, e: Entity) -> list[str]:
        rng = self.rng
        sentences = [
            f"The {e.name} is a device for {rng.choice(_PURPOSES)}, {RELATION_PHRASES['invented_by']}"
            f"{self._name(e.relations['invented_by'])} in {rng.randrange(1750, 1990)}.",
        ]
        if rng.random() < 0.4:
            sentences.append(f"Early models of the {e.name} were built by {self._pick('company').name}.")
        sentences.append(f"The {e.name} is still shown in museums today.")
        return sentences

    def _river_text(self, e: Entity, course: list[str]) -> list[str]:
        rng = self.rng
        through = " and ".join(self._name(city_id) for city_id in course)
        return [
            f"The {e.name} is a river that {RELATION_PHRASES['rises_in']}{self._name(e.relations['rises_in'])}.",
            f"It flows through {through} before reaching the sea.",
            f"The {e.name} is about {rng.randrange(40, 2500)} kilometres long.",
        ]

    # --- questions ---------------------------------------------------------------------------

    def _chain(self, start: Entity, relations: Sequence[str]) -> list[Entity]:
        chain = [start]
        for relation in relations:
            chain.append(self.entities[chain[-1].relations[relation]])
        return chain

    def build_questions(self) -> list[Question]:
        rng, config = self.rng, self.config
        picked: list[tuple[ChainTemplate, list[Entity]]] = []
        for hops in (1, 2, 3):
            candidates_per_template = []
            for template in (t for t in CHAIN_TEMPLATES if len(t.relations) == hops):
                candidates = []
                for start in self.by_kind[template.start_kind]:
                    chain = self._chain(start, template.relations)
                    # an answer that is also a chain entity would let a shorter search path answer it
                    if chain[-1].id not in {entity.id for entity in chain[:-1]}:
                        candidates.append(chain)
                rng.shuffle(candidates)
                candidates_per_template.append((template, candidates))
            # round-robin over templates so every kind of question is represented
            chosen = 0
            for round_index in range(max(len(c) for _, c in candidates_per_template)):
                for template, candidates in candidates_per_template:
                    if chosen < config.questions_per_hop and round_index < len(candidates):
                        picked.append((template, candidates[round_index]))
                        chosen += 1
        # split by start entity so a test question's entity never starts a train question
        start_ids = list(dict.fromkeys(chain[0].id for _, chain in picked))
        rng.shuffle(start_ids)
        test_starts = set(start_ids[: math.ceil(len(start_ids) * config.test_fraction)])
        questions = []
        for index, (template, chain) in enumerate(picked):
            questions.append(
                Question(
                    id=f"w{self.seed}-q{index:05d}",
                    question=template.text.format(name=chain[0].name),
                    golden_answers=tuple(chain[-1].answer_names),
                    hops=len(template.relations),
                    supporting_doc_ids=tuple(entity.id for entity in chain[:-1]),
                    template=template.name,
                    split="test" if chain[0].id in test_starts else "train",
                )
            )
        return questions


def generate_world(seed: int = 0, config: WorldConfig | None = None) -> World:
    """Generate (or fetch from the in-process cache) the world of ``seed``.

    Example:
        >>> generate_world(1).content_hash() == generate_world(1).content_hash()
        True
    """
    return _generate_world_cached(seed, config or WorldConfig())


@functools.lru_cache(maxsize=4)
def _generate_world_cached(seed: int, config: WorldConfig) -> World:
    builder = _Builder(seed, config)
    builder.build_entities()
    documents = builder.build_documents()
    questions = builder.build_questions()
    world = World(seed, config, builder.entities, documents, questions)
    world.check()  # cheap (~0.1 s) and guarantees no caller ever sees an ambiguous question
    return world


__all__ = ["generate_world"]
