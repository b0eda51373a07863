"""The codebook: common words mapped to secret 4-digit codes, and questions about them.

Everything is generated from a seed, so the task ships no data file and needs no download: the same
seed always gives the same codes and the same train / test questions. Train and test use disjoint
words, so a gain on the test split is a gain in *using the tool*, not in memorising codes.

Each question ends with the exact tool call that answers it (``with_call_hint``, on by default):
SmolLM2-135M-Instruct made no valid call at all without it (see docs/learning.md), so the task
asks the model to make that call as its whole turn and then to read the code off the tool's result.

Example:
    >>> book = make_codebook(seed=0)
    >>> len(book), all(len(code) == 4 and code.isdigit() for code in book.values())
    (120, True)
    >>> make_codebook(seed=0) == book, make_codebook(seed=1) == book
    (True, False)
"""

from __future__ import annotations

import random
from typing import Any

DEFAULT_SEED = 0
NUM_TEST_WORDS = 24
# The system prompt's worked example; never a real word or code, so copying the example never scores.
EXAMPLE_WORD = "sky"
EXAMPLE_CODE = "4093"

# 120 short, common, single-token-ish nouns: the model should find the key easy to copy into a call.
WORDS: tuple[str, ...] = (
    "apple",
    "river",
    "stone",
    "cloud",
    "tiger",
    "bread",
    "chair",
    "piano",
    "lemon",
    "horse",
    "candle",
    "garden",
    "window",
    "pencil",
    "rocket",
    "forest",
    "castle",
    "bottle",
    "silver",
    "orange",
    "planet",
    "mirror",
    "button",
    "ladder",
    "island",
    "wallet",
    "jacket",
    "carpet",
    "bridge",
    "engine",
    "flower",
    "hammer",
    "kitten",
    "basket",
    "dragon",
    "violin",
    "rabbit",
    "pepper",
    "tomato",
    "cookie",
    "banana",
    "cherry",
    "coffee",
    "desert",
    "doctor",
    "farmer",
    "finger",
    "guitar",
    "helmet",
    "jungle",
    "kettle",
    "lizard",
    "magnet",
    "market",
    "meadow",
    "monkey",
    "needle",
    "oyster",
    "parrot",
    "pillow",
    "pirate",
    "pocket",
    "puzzle",
    "saddle",
    "salmon",
    "shadow",
    "spider",
    "spoon",
    "statue",
    "sugar",
    "summer",
    "sunset",
    "tunnel",
    "turtle",
    "valley",
    "wagon",
    "winter",
    "wizard",
    "yellow",
    "zebra",
    "anchor",
    "arrow",
    "beach",
    "bell",
    "book",
    "brush",
    "camel",
    "clock",
    "comet",
    "crown",
    "daisy",
    "eagle",
    "feather",
    "glove",
    "grape",
    "honey",
    "iron",
    "jewel",
    "kite",
    "lamp",
    "maple",
    "moon",
    "nest",
    "ocean",
    "owl",
    "pearl",
    "queen",
    "rain",
    "ship",
    "snow",
    "storm",
    "sword",
    "table",
    "tower",
    "train",
    "tulip",
    "violet",
    "whale",
    "wolf",
    "yarn",
)

CALL_HINT = (
    '\nReply with exactly: <tool_call>{{"name": "lookup", "arguments": {{"word": "{word}"}}}}</tool_call>'
)

QUESTION_TEMPLATES: tuple[str, ...] = (
    "What is the secret code for the word '{word}'?",
    "Find the secret code of '{word}'.",
    "I need the secret code for '{word}'. What is it?",
    "Tell me the secret code for the word '{word}'.",
)


def make_codebook(seed: int = DEFAULT_SEED) -> dict[str, str]:
    """Every word of :data:`WORDS` mapped to a distinct 4-digit code (1000-9999, never
    :data:`EXAMPLE_CODE`), drawn from ``seed``.

    Example:
        >>> sorted(make_codebook(0))[:2]
        ['anchor', 'apple']
    """
    rng = random.Random(seed)
    population = [code for code in range(1000, 10000) if str(code) != EXAMPLE_CODE]
    codes = rng.sample(population, len(WORDS))
    return {word: str(code) for word, code in zip(WORDS, codes, strict=True)}


def make_task_records(
    seed: int = DEFAULT_SEED, *, with_call_hint: bool = True
) -> dict[str, list[dict[str, Any]]]:
    """Question records ``{"id", "question", "answer", "word"}`` for the ``train`` and ``test`` splits.

    The words are shuffled with ``seed``; the first :data:`NUM_TEST_WORDS` form the test split and
    the rest the train split, one question per word, its template drawn with the same seed.
    ``with_call_hint`` appends :data:`CALL_HINT` (the exact call to make) to every question.

    Example:
        >>> records = make_task_records(0)
        >>> len(records["train"]), len(records["test"])
        (96, 24)
        >>> records["train"][0]["answer"] == make_codebook(0)[records["train"][0]["word"]]
        True
    """
    book = make_codebook(seed)
    rng = random.Random(f"codebook-questions-{seed}")
    words = list(WORDS)
    rng.shuffle(words)
    splits: dict[str, list[dict[str, Any]]] = {"test": [], "train": []}
    for index, word in enumerate(words):
        split = "test" if index < NUM_TEST_WORDS else "train"
        template = rng.choice(QUESTION_TEMPLATES)
        question = template.format(word=word) + (CALL_HINT.format(word=word) if with_call_hint else "")
        splits[split].append(
            {
                "id": f"codebook-{seed}-{split}-{len(splits[split])}",
                "question": question,
                "answer": book[word],
                "word": word,
            }
        )
    return splits
