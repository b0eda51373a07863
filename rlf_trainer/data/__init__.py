"""What a run starts from: offline models and demonstrations (``rlf-models``, ``rlf-collect``)."""
