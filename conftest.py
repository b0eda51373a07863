"""Names for the packages' docstring examples (``pytest --doctest-modules``).

pytest applies a conftest.py only to the files below its folder, so the doctests of ``rlf_trainer``
and the other packages get their names from this file at the repository root; the tests' fixtures
are in ``tests/conftest.py``. Names are added only for the modules whose examples use them, so a
doctest run of ``rlf_envs`` alone never loads transformers.
"""

from __future__ import annotations

from typing import Any

import pytest

# Modules whose examples use `tok` and `tmp` (the tiny Qwen3's tokenizer, a fresh folder) ...
_NEEDS_TINY_TOKENIZER = (
    "rlf_trainer.rollout.chat",
    "rlf_trainer.observe.budget",
    "rlf_trainer.algorithms.sft_data",
    "rlf_trainer.rollout.guidance",
)
# ... and `tiny_model_dir` (and, for the Policy contract, `policy`: an HFPolicy on the tiny model).
_NEEDS_TINY_MODEL = ("rlf_trainer.policy.hf", "rlf_trainer.policy.base")


@pytest.fixture(scope="session")
def doctest_tiny_tokenizer() -> Any:
    """The tiny Qwen3's tokenizer (ChatML template with Hermes tools), built offline and cached."""
    from transformers import AutoTokenizer

    from tests.helpers import tiny_model_path

    return AutoTokenizer.from_pretrained(tiny_model_path())


@pytest.fixture(autouse=True)
def _doctest_names(request: pytest.FixtureRequest, doctest_namespace: dict[str, Any]) -> None:
    module = getattr(getattr(request.node, "dtest", None), "globs", {}).get("__name__", "")
    if module.startswith(_NEEDS_TINY_TOKENIZER):
        doctest_namespace["tok"] = request.getfixturevalue("doctest_tiny_tokenizer")
        doctest_namespace["tmp"] = request.getfixturevalue("tmp_path")
    if module.startswith(_NEEDS_TINY_MODEL):
        from tests.helpers import tiny_model_path

        doctest_namespace["tiny_model_dir"] = tiny_model_path()
    if module == "rlf_trainer.policy.base":
        from transformers import AutoModelForCausalLM

        from rlf_trainer.policy.hf import HFPolicy

        model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
        doctest_namespace["policy"] = HFPolicy(model, request.getfixturevalue("doctest_tiny_tokenizer"))
