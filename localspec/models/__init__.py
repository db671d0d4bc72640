"""What a model is, where it comes from and where it fits.

* ``registry``: names and aliases resolved to typed records (``ModelSpec``);
  ``registry_file`` reads ``models.toml`` into them.
* ``gguf_info``: what a GGUF header says about its model.
* ``hub`` with ``pypi_models`` and ``rangefile``: where model files come from.

Nothing here imports ``llama_cpp`` or the engine.
"""
