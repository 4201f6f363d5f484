"""The plain minimal GPT now lives in the package (``attnlab bench`` uses it); kept importable here."""

from reports.bench.reference import PlainBlock, PlainGPT

__all__ = ["PlainBlock", "PlainGPT"]
