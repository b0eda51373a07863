"""pytest --doctest-modules over rlf_studio: the page's modules need gradio (the ``studio`` extra)."""

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("gradio") else ["ui/*.py"]
