"""The positions a model can take: its usable context, from the config.

A learned position table of ``max_position_embeddings`` rows serves positions 0 .. max - 1, except where the
model numbers positions from an offset inside the same table: fairseq's ``make_positions``, which RoBERTa
(Liu et al. 2019) and its descendants were trained with, gives the first real token position
``padding_idx + 1`` (transformers' RobertaEmbeddings: ``padding_idx = config.pad_token_id``), so only
``max_position_embeddings - pad_token_id - 1`` positions are usable. OPT's table instead has
``max_position_embeddings + 2`` rows and offsets inside (its OPTLearnedPositionalEmbedding), so all
``max_position_embeddings`` are usable. An input past the usable context is not one the model declares it
can take: the suite never draws it.
"""

from __future__ import annotations

from typing import Any

from harness.oracle.fields import Fact, integer, model_type, text_config, unknown

# learned tables numbered from padding_idx + 1 (fairseq's make_positions)
FAIRSEQ_POSITIONS = ("roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "xmod", "roberta-prelayernorm",
                     "data2vec-text", "longformer", "ibert", "mpnet", "luke", "markuplm")


def usable_context(config: Any) -> Fact:
    """The number of positions the model can take (positions 0 .. n - 1 of the protocol)."""
    c = text_config(config)
    table = integer(c, "max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "n_ctx")
    if table is None:
        return unknown("the config names no context length (max_position_embeddings/n_positions/...)")
    name, rows = table
    kind = model_type(c)
    if kind in FAIRSEQ_POSITIONS:
        pad = integer(c, "pad_token_id")
        first = (pad[1] if pad else 0) + 1
        return Fact(rows - first, f"{name}={rows} - (pad_token_id={pad[1] if pad else None} + 1): "
                                  "fairseq numbers positions from padding_idx + 1")
    return Fact(rows, f"{name}={rows}")
