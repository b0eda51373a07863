"""RLF Studio: a zero-code web UI over both halves of RLF (``rlf-studio`` or ``python -m rlf_studio``).

A higher layer: it uses only public APIs of :mod:`rlf_envs`, :mod:`rlf_trainer` and nothing imports
it. The backends (:mod:`~rlf_studio.project`, :mod:`~rlf_studio.tools`, :mod:`~rlf_studio.data`,
:mod:`~rlf_studio.rewards`, :mod:`~rlf_studio.playground`, :mod:`~rlf_studio.training`,
:mod:`~rlf_studio.runner`, :mod:`~rlf_studio.runs`) are plain Python; only :mod:`rlf_studio.ui`
imports Gradio (the ``studio`` extra). See docs/studio.md.
"""
