"""The one tokenizer of DeepSearch: the BM25 index and the world generator's ambiguity checks agree on it.

Example:
    >>> tokenize("The Kelmar River flows into Zorvia")
    ['kelmar', 'river', 'flows', 'zorvia']
"""

from __future__ import annotations

import re

from bm25s.stopwords import STOPWORDS_EN

STOPWORDS = frozenset(STOPWORDS_EN)
_TOKEN = re.compile(r"(?u)\b\w\w+\b")  # scikit-learn / bm25s default: words of two or more characters


def tokenize(text: str) -> list[str]:
    """Lowercased word tokens without English stopwords: the same for passages and queries."""
    return [token for token in _TOKEN.findall(text.lower()) if token not in STOPWORDS]
