"""Benchmarks comparing hpcdl with its peers; run with ``hpcdl bench NAME`` or ``python benchmarks/NAME.py``."""
