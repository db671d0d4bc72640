"""What a model is, where it comes from and where it fits.

``registry`` (names and ``models.toml``), ``gguf_info`` (GGUF headers), ``hub`` with
``pypi_models`` and ``rangefile`` (where model files come from). Nothing here imports
``llama_cpp`` or the engine.
"""
