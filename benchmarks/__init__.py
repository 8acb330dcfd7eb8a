"""Benchmarks comparing hpcdl with its peers.

Run with ``hpcdl bench NAME`` or ``python benchmarks/NAME.py``.
"""
