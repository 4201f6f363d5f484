"""Deliberately broken attention models that the property suite must flag (see catalogue.py)."""
