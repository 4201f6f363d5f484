"""Helpers shared by several test modules. No file here is named ``test_*.py``, so pytest collects
nothing from this package, and no test module ever imports another test module."""
