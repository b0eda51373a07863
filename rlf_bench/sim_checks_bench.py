"""``rlf-bench simulator-checks``: precision and recall of the simulator checks on a labelled set.

The set (``rlf_envs/dialogue/data/sim_replies.jsonl``) holds simulator replies, each with the
agent's last message, the hidden instructions, the turn and a label: ``good`` (an ordinary customer
line) or ``bad`` with its category (agent voice, parroting, role labels, self-identification,
prompt leak, stop-instruction leak, special tokens, tool-call JSON). Its ``dev`` split is what
the rules were written against; the ``heldout`` split was written after and never tuned on.

Every reply goes through :func:`~rlf_envs.dialogue.flags.check_reply` exactly as in the env (the
default simulator system prompt, the stop marker); with ``--judge-url`` the replies the rules
pass go to the judge model as well (:class:`~rlf_envs.dialogue.judge.SimulatorJudge`, all at once).
A judge failure counts as a flag, as in the env, and is counted apart.

Per category: recall = flagged bad replies of the category / its bad replies; precision = those
/ (those + good lines flagged with the category's kind; a judge flag counts for every category).
The ``good lines`` row gives the false-positive rate; the ``all`` rows both splits together.

Example:
    rlf-bench simulator-checks
    rlf-bench simulator-checks --judge-url http://127.0.0.1:8000/v1 --judge-model qwen3-8b --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlf_envs.dialogue.flags import DEFAULT_STOP_MARKER, JudgeSettings, SimErrorKind, SimFlag, check_reply
from rlf_envs.dialogue.judge import JudgeItem, SimulatorJudge
from rlf_envs.dialogue.simulator import DEFAULT_SIMULATOR_PROMPT

DATA_PATH = Path(__file__).resolve().parent.parent / "rlf_envs" / "dialogue" / "data" / "sim_replies.jsonl"
_JUDGE_FAILURES = (SimErrorKind.JUDGE_ERROR, SimErrorKind.JUDGE_TIMEOUT)


@dataclass(frozen=True)
class LabelledReply:
    """One row of the labelled set."""

    id: str
    split: str
    label: str  # "good" or "bad"
    category: str
    kind: str | None  # the rule kind a bad reply of this category should get
    turn: int
    agent: str
    instructions: str
    reply: str


@dataclass(frozen=True)
class Scored:
    """A row with the rules' flag and, when a judge ran, the judge's (None: passed)."""

    row: LabelledReply
    rules: SimFlag | None
    judge: SimFlag | None = None


def load_replies(path: Path = DATA_PATH) -> list[LabelledReply]:
    """The labelled set; each line a JSON object with :class:`LabelledReply`'s fields."""
    with open(path, encoding="utf-8") as fh:
        return [LabelledReply(**json.loads(line)) for line in fh if line.strip()]


def rules_flag(row: LabelledReply) -> SimFlag | None:
    """The env's rule check on one row (default prompt and stop marker)."""
    prompt = DEFAULT_SIMULATOR_PROMPT.format(instructions=row.instructions, stop_marker=DEFAULT_STOP_MARKER)
    return check_reply(
        row.reply, row.instructions, turn=row.turn, agent_message=row.agent, system_prompt=prompt
    )


async def score(rows: Sequence[LabelledReply], judge: SimulatorJudge | None = None) -> list[Scored]:
    """Rules on every row; the judge (if any) on the rows the rules pass, all requests at once."""
    flags = [rules_flag(row) for row in rows]
    if judge is None:
        return [Scored(row, flag) for row, flag in zip(rows, flags, strict=True)]
    texts = [row.reply.replace(DEFAULT_STOP_MARKER, " ").strip() for row in rows]
    todo = [i for i, flag in enumerate(flags) if flag is None and texts[i]]  # as the env's runner does
    verdicts = await judge.judge_many(
        [JudgeItem(texts[i], rows[i].agent, rows[i].instructions) for i in todo]
    )
    judged = dict(zip(todo, verdicts, strict=True))
    return [Scored(row, flag, judged.get(i)) for i, (row, flag) in enumerate(zip(rows, flags, strict=True))]


def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None


def _category_stats(scored: list[Scored], category: str, with_judge: bool) -> dict[str, Any]:
    bad = [s for s in scored if s.row.label == "bad" and s.row.category == category]
    kind = bad[0].row.kind if bad else None

    def flagged(s: Scored) -> bool:
        return s.rules is not None or (with_judge and s.judge is not None)

    hits = sum(1 for s in bad if flagged(s))
    false = sum(
        1 for s in scored
        if s.row.label == "good" and ((s.rules is not None and s.rules.kind == kind) or (with_judge and s.judge is not None))
    )  # fmt: skip
    return {
        "n": len(bad),
        "flagged": hits,
        "recall": _ratio(hits, len(bad)),
        "precision": _ratio(hits, hits + false),
    }


def summarize(scored: list[Scored], with_judge: bool) -> dict[str, Any]:
    """Per split: per category precision/recall, all bad replies together, and the good lines' FPR."""
    summary: dict[str, Any] = {}
    splits = sorted({s.row.split for s in scored})
    for split in [*splits, "all"] if len(splits) > 1 else splits:
        part = [s for s in scored if split in ("all", s.row.split)]
        modes = {"rules": False, "rules+judge": True} if with_judge else {"rules": False}
        out: dict[str, Any] = {}
        for mode, judge_on in modes.items():

            def flagged(s: Scored, judge_on: bool = judge_on) -> bool:
                return s.rules is not None or (judge_on and s.judge is not None)

            categories = sorted({s.row.category for s in part if s.row.label == "bad"})
            bad = [s for s in part if s.row.label == "bad"]
            good = [s for s in part if s.row.label == "good"]
            tp, fp = sum(map(flagged, bad)), sum(map(flagged, good))
            out[mode] = {
                "categories": {c: _category_stats(part, c, judge_on) for c in categories},
                "all_bad": {
                    "n": len(bad),
                    "flagged": tp,
                    "recall": _ratio(tp, len(bad)),
                    "precision": _ratio(tp, tp + fp),
                },  # fmt: skip
                "good": {
                    "n": len(good),
                    "flagged": fp,
                    "false_positive_rate": _ratio(fp, len(good)),
                    "false_positives": [s.row.id for s in good if flagged(s)],
                },  # fmt: skip
                "judge_failures": sum(
                    1 for s in part if judge_on and s.judge and s.judge.kind in _JUDGE_FAILURES
                ),
            }
        summary[split] = out
    return summary


def _cell(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_table(summary: dict[str, Any]) -> str:
    """The summary as a Markdown table (the one docs/dialogue.md shows)."""
    lines = [
        "| split | category | n | rules P | rules R | rules+judge P | rules+judge R |",
        "|---|---|---|---|---|---|---|",
    ]
    for split, modes in summary.items():
        rules, judged = modes["rules"], modes.get("rules+judge")
        for category, stats in rules["categories"].items() if split != "all" else ():
            other = judged["categories"][category] if judged else {}
            lines.append(f"| {split} | {category} | {stats['n']} | {_cell(stats['precision'])} | {_cell(stats['recall'])} "
                         f"| {_cell(other.get('precision'))} | {_cell(other.get('recall'))} |")  # fmt: skip
        other = judged["all_bad"] if judged else {}
        lines.append(f"| {split} | **all bad** | {rules['all_bad']['n']} | {_cell(rules['all_bad']['precision'])} "
                     f"| {_cell(rules['all_bad']['recall'])} | {_cell(other.get('precision'))} | {_cell(other.get('recall'))} |")  # fmt: skip
        fpr = judged["good"]["false_positive_rate"] if judged else None
        lines.append(f"| {split} | **good lines: false-positive rate** | {rules['good']['n']} | | "
                     f"{_cell(rules['good']['false_positive_rate'], 3)} | | {_cell(fpr, 3)} |")  # fmt: skip
    return "\n".join(lines)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rlf-bench simulator-checks", description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DATA_PATH, help="labelled replies (JSONL)")
    parser.add_argument("--split", default="all", help="dev, heldout or all")
    parser.add_argument("--judge-url", help="OpenAI-compatible base URL of the judge model")
    parser.add_argument("--judge-model", default="default")
    parser.add_argument("--judge-timeout-s", type=float, default=20.0)
    parser.add_argument("--judge-api-key")
    parser.add_argument("--judge-concurrency", type=int, default=32)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    return parser.parse_args(argv)


async def _run(args: argparse.Namespace, rows: list[LabelledReply]) -> list[Scored]:
    if not args.judge_url:
        return await score(rows)
    judge = SimulatorJudge(JudgeSettings(
        args.judge_url, args.judge_model, timeout_s=args.judge_timeout_s, api_key=args.judge_api_key,
        max_concurrency=args.judge_concurrency,
    ))  # fmt: skip
    try:
        return await score(rows, judge)
    finally:
        await judge.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    rows = [r for r in load_replies(args.data) if args.split in ("all", r.split)]
    if not rows:
        print(f"no rows of split {args.split!r} in {args.data}")
        return 2
    summary = summarize(asyncio.run(_run(args, rows)), with_judge=bool(args.judge_url))
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        counts = {s: sum(1 for r in rows if r.split == s) for s in sorted({r.split for r in rows})}
        print(
            f"simulator checks on {args.data.name} ({', '.join(f'{s}: {n} replies' for s, n in counts.items())})"
        )
        print(format_table(summary))
        for split, modes in summary.items():
            for mode, stats in modes.items() if split != "all" else ():
                if stats["good"]["false_positives"] or stats["judge_failures"]:
                    print(f"{split} {mode}: false positives {stats['good']['false_positives']}, "
                          f"judge failures {stats['judge_failures']}")  # fmt: skip
    return 0
