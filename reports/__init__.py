"""Figures, HTML/Markdown reports and the `attnlab` command."""
