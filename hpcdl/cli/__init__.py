"""The ``hpcdl`` command: one module per command group; each parses, calls the library and renders."""
