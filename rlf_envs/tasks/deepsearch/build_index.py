"""``rlf-search-index``: build a BM25 search index directory from a corpus JSONL or the generated world.

Example:
    rlf-search-index --corpus wiki-18.jsonl --out indexes/wiki18-bm25
    rlf-search-index --world-seed 0 --out indexes/world0 --export-qa data/world0
    python -m rlf_envs.tasks.deepsearch.build_index --corpus corpus.jsonl --out DIR --limit 100000
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rlf_envs.tasks.deepsearch.data import read_corpus
from rlf_envs.tasks.deepsearch.index import build_index_dir, read_meta


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlf-search-index", description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--corpus", type=Path, help="corpus JSONL(.gz): id + contents, or id + title + text")
    source.add_argument("--world-seed", type=int, help="index the generated DeepSearch world of this seed")
    parser.add_argument(
        "--out", type=Path, required=True, help="index directory to write (replaced atomically)"
    )
    parser.add_argument("--limit", type=int, default=None, help="index only the first N passages")
    parser.add_argument(
        "--export-qa",
        type=Path,
        default=None,
        help="with --world-seed: also write corpus.jsonl, train.jsonl and test.jsonl into this directory",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    started = time.perf_counter()
    if args.world_seed is not None:
        from rlf_envs.tasks.deepsearch.world_builder import generate_world

        world = generate_world(args.world_seed)
        documents = world.documents[: args.limit] if args.limit is not None else world.documents
        build_index_dir(documents, args.out, source={"world_seed": args.world_seed})
        if args.export_qa is not None:
            args.export_qa.mkdir(parents=True, exist_ok=True)
            world.write_corpus(args.export_qa / "corpus.jsonl")
            for split in ("train", "test"):
                world.write_questions(args.export_qa / f"{split}.jsonl", split)
    else:
        if args.export_qa is not None:
            print("--export-qa only applies to --world-seed", file=sys.stderr)
            return 2
        if not args.corpus.is_file():
            print(f"no corpus file at {args.corpus}", file=sys.stderr)
            return 2
        build_index_dir(
            read_corpus(args.corpus, limit=args.limit), args.out, source={"corpus": str(args.corpus)}
        )
    meta = read_meta(args.out) or {}
    print(
        f"indexed {meta.get('doc_count')} passages ({meta.get('vocab_size')} terms) into {args.out} "
        f"in {time.perf_counter() - started:.1f}s; content hash {str(meta.get('content_hash'))[:12]}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
