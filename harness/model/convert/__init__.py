"""Weights to and from Hugging Face: ``from_hf`` (GPT-2, Llama -> ours) and ``to_hf`` (ours -> GPT-2, Llama).

Both directions check every config option first and refuse, naming the field, what the other
side cannot reproduce exactly; nothing here touches the network.
"""

from harness.model.convert.from_hf import SUPPORTED, from_hf
from harness.model.convert.to_hf import check_exportable, to_hf

__all__ = ["SUPPORTED", "check_exportable", "from_hf", "to_hf"]
