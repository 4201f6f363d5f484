"""Every model type the installed transformers ships for causal, masked and sequence-to-sequence LM.

Read from transformers' auto mappings, so the census follows the installed release: one
:class:`ModelType` per distinct ``model_type``, with the head class the census builds (causal LM
first, then masked LM, then seq2seq LM) and every task the type is mapped for.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers.models.auto import modeling_auto

# task -> the auto mapping of model_type -> head class name, in the order the census prefers a head
MAPPINGS = {"causal_lm": modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
            "masked_lm": modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
            "seq2seq_lm": modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES}


@dataclass(frozen=True)
class ModelType:
    name: str  # the config's model_type
    task: str  # the head the census builds
    class_name: str
    tasks: tuple[str, ...]  # every mapping it appears in


def model_types() -> list[ModelType]:
    """Every distinct model type in :data:`MAPPINGS`, sorted by name."""
    found: dict[str, ModelType] = {}
    for task, mapping in MAPPINGS.items():
        for name, cls in mapping.items():
            cls = cls[0] if isinstance(cls, (list, tuple)) else cls
            if name in found:
                old = found[name]
                found[name] = ModelType(old.name, old.task, old.class_name, (*old.tasks, task))
            else:
                found[name] = ModelType(name, task, cls, (task,))
    return [found[n] for n in sorted(found)]


def by_name() -> dict[str, ModelType]:
    return {m.name: m for m in model_types()}
