"""rlf-serve: an OpenAI-compatible chat server over a local model (HF or vLLM) that batches requests.

Its clients are the env half's model-backed parts: the LLM judge, the agent tool and the user
simulator (all through :mod:`rlf_envs.llm_client`). It loads models through the trainer's
policies, so it needs ``rlf[trainer]``. Modules: ``protocol`` (the wire format), ``backends``
(batch in, replies out), ``batching`` (gathering concurrent requests), ``app`` (HTTP + CLI).
"""
