"""Rule rewards on hand-computed cases, and the registry on real Episode objects."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlf_envs.rewards.rules import (
    RULE_REWARDS,
    contains_match,
    exact_match,
    extract_answer,
    f1_score,
    get_rule_reward,
    math_equal,
    normalize_answer,
)
from rlf_envs.types import Episode, TaskInstance


def make_episode(answer: object, *, final_answer: str | None = None, final_response: str = "") -> Episode:
    return Episode(
        instance=TaskInstance(id="q", question="?", answer=answer),
        messages=[],
        final_response=final_response,
        final_answer=final_answer,
        tool_calls=[],
        turns=1,
        terminated=True,
        truncated=False,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("  a   CAT, an owl! ", "cat owl"),
        ("Kelmar-River.", "kelmarriver"),  # SQuAD drops punctuation without inserting a space
        ("theatre", "theatre"),  # articles only as whole words
        ("", ""),
    ],
)
def test_normalize_answer(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


def test_exact_match_against_one_or_many_golds() -> None:
    assert exact_match("the Zorvia", "Zorvia") == 1.0
    assert exact_match("Republic of Zorvia", ["Zorvia", "republic of zorvia"]) == 1.0
    assert exact_match("Zorvian", ["Zorvia"]) == 0.0
    assert exact_match(None, ["Zorvia"]) == 0.0
    assert exact_match("Zorvia", []) == 0.0


def test_f1_hand_computed() -> None:
    # pred {cat, sat} vs gold {cat, sat, on, mat}: precision 1, recall 1/2 -> F1 2/3
    assert f1_score("the cat sat", "cat sat on the mat") == pytest.approx(2 / 3)
    # pred {kelmar, river, delta} vs gold {kelmar, river}: precision 2/3, recall 1 -> F1 0.8
    assert f1_score("Kelmar river delta", "the Kelmar River") == pytest.approx(0.8)
    # max over golds: vs "Vosk" precision 1/2 recall 1 -> 2/3; vs "Tarin Vosk" -> 1
    assert f1_score("Tarin Vosk", ["Vosk", "Tarin Vosk"]) == 1.0
    assert f1_score("Tarin Vosk", ["Vosk"]) == pytest.approx(2 / 3)
    # a repeated token overlaps only as often as the gold has it: precision 1/3, recall 1 -> F1 0.5
    assert f1_score("x x y", "x") == pytest.approx(0.5)
    assert f1_score("nothing shared", "Zorvia") == 0.0
    assert f1_score(None, "Zorvia") == 0.0


def test_contains_matches_whole_words_only() -> None:
    assert contains_match("I believe it is the Republic of Zorvia.", ["zorvia"]) == 1.0
    assert contains_match("party", ["art"]) == 0.0
    assert contains_match("anything", [""]) == 0.0
    assert contains_match(None, ["x"]) == 0.0


def test_extract_answer_takes_the_last_complete_block() -> None:
    text = "<answer> Beijing </answer> example... <think>hmm</think><answer>\n Zorvia \n</answer> trailing"
    assert extract_answer(text) == "Zorvia"
    assert extract_answer("no tags") is None
    assert extract_answer("<answer>unclosed") is None
    assert extract_answer(None) is None
    assert extract_answer("<final>7</final>", tag="final") == "7"
    assert extract_answer("<answer></answer>") == ""


@pytest.mark.parametrize(
    ("pred", "gold", "expected"),
    [
        ("42", "42", True),
        ("42.0", 42, True),
        ("0.5", "1/2", True),
        ("\\boxed{\\frac{3}{4}}", "0.75", True),
        ("The answer is $\\boxed{\\dfrac{1}{3}}$.", "1/3", True),
        ("1,000", "1000", True),
        ("50%", "0.5", True),
        ("-2.5", "-5/2", True),
        ("0.3333333333", "1/3", True),  # within the default relative tolerance
        ("0.33", "1/3", False),
        ("41", "42", False),
        ("1/0", "0", False),
        ("x+1", "x+1", True),  # not a number: cleaned strings compared
        ("x+1", "x+2", False),
        (None, "1", False),
        ("", "", False),
    ],
)
def test_math_equal(pred: str | None, gold: str | int, expected: bool) -> None:
    assert math_equal(pred, gold) is expected


def test_registry_uses_final_answer_then_extracts_from_the_response() -> None:
    episode = make_episode(["Zorvia", "Republic of Zorvia"], final_answer="republic of zorvia")
    assert RULE_REWARDS["exact_match"](episode) == {"reward": 1.0, "em": 1.0, "f1": 1.0}
    extracted = make_episode("Tarin Vosk", final_response="<think>..</think><answer>Vosk</answer>")
    scores = RULE_REWARDS["f1"](extracted)
    assert scores["reward"] == pytest.approx(2 / 3) and scores["em"] == 0.0
    contained = make_episode(["Zorvia"], final_answer="It is Zorvia")
    assert RULE_REWARDS["contains"](contained)["reward"] == 1.0
    assert RULE_REWARDS["exact_match"](contained)["reward"] == 0.0
    unanswered = make_episode(["Zorvia"], final_response="I do not know")
    assert RULE_REWARDS["exact_match"](unanswered) == {"reward": 0.0, "em": 0.0, "f1": 0.0}
    math = make_episode("12", final_response="<answer>\\boxed{12}</answer>")
    assert RULE_REWARDS["math"](math)["reward"] == 1.0


def test_unknown_reward_name_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match="exact_match"):
        get_rule_reward("nope")


@given(st.text(max_size=40))
def test_a_prediction_matches_itself(text: str) -> None:
    assert exact_match(text, [text]) == 1.0
    if normalize_answer(text):
        assert f1_score(text, text) == 1.0
        assert contains_match(text, [text]) == 1.0


def test_math_equal_integers_are_exact_even_when_large():
    assert not math_equal("18272728", 18272727)
    assert math_equal("18,272,727", 18272727)
    assert math_equal("0.3333333", "1/3", rel_tol=1e-6)
