"""The Gradio page: one module per tab, each with a ``build(studio, project)`` that wires its widgets.

Only :mod:`rlf_studio.ui.app` is imported from outside; everything here imports gradio.
"""
