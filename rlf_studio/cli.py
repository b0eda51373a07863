"""``rlf-studio`` / ``python -m rlf_studio``: start the studio on a local port and print its URL.

Example:
    >>> parse_args(["--port", "0", "--project-dir", "/tmp/p"]).port
    0
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rlf_envs.ports import free_local_port

DEFAULT_PORT = 7870


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rlf-studio", description="RLF Studio: a zero-code web UI for RLF.")
    parser.add_argument("--host", default="127.0.0.1", help="interface to serve on (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: a free one)"
    )
    parser.add_argument("--project-dir", default="studio_projects", help="folder that holds the projects")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # a local tool: no usage pings
    try:
        from rlf_studio.ui.app import CSS, build_app
    except ImportError as exc:
        print(f"rlf-studio needs the studio extra: pip install 'rlf[studio]' ({exc})", file=sys.stderr)
        return 2
    port = args.port or free_local_port(args.host)
    app, studio = build_app(Path(args.project_dir))
    app.queue(default_concurrency_limit=8)
    app.launch(server_name=args.host, server_port=port, prevent_thread_lock=True, quiet=True, css=CSS,
               footer_links=[], show_error=True)  # fmt: skip
    print(f"RLF Studio running at http://{args.host}:{port} (projects in {studio.root})", flush=True)
    try:
        app.block_thread()
    except KeyboardInterrupt:
        pass
    finally:
        studio.close()
        app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
