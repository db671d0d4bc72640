"""The Textual front end of localspec (``localspec run``): it depends on the engine, never the reverse."""
