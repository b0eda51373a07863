"""The Python reward docs/studio.md shows: what a reward function receives, used for real."""


def reward(episode):
    """1 for the gold answer, minus 0.1 per failed tool call; the failed calls reported on their own."""
    gold = episode.instance.answer  # the answer column: text, or a list (Search-R1 golden_answers)
    golds = gold if isinstance(gold, list) else [gold]
    said = (episode.final_answer or "").strip().lower()  # the text inside <answer>...</answer>, or None
    right = said in {str(g).strip().lower() for g in golds}
    failed = sum(1 for call in episode.tool_calls if not call["ok"])
    return {"reward": float(right) - 0.1 * failed, "failed_calls": failed}
