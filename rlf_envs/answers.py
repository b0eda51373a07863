"""Where an assistant turn states its final answer: the content of an answer tag.

The env core uses it to record an episode's ``final_answer``; the rule rewards use it to score.
It sits below both so that neither imports the other.
"""

from __future__ import annotations

import re


def extract_answer(text: str | None, tag: str = "answer") -> str | None:
    """The stripped content of the LAST complete ``<tag>...</tag>`` block, or None.

    Example:
        >>> extract_answer("<think>..</think><answer> 42 </answer>")
        '42'
        >>> extract_answer("no tags here") is None
        True
    """
    if not text:
        return None
    matches = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, flags=re.DOTALL)
    if not matches:
        return None
    return matches[-1].strip()
