"""The census's documented findings: failed rows that are bugs in the wrapped implementation.

Each names the witness (a function in tests/helpers/census_witness.py) that shows the bug on the
raw model without the property suite; tests/test_census_witness.py asserts each still reproduces.
A failed row not listed here is ``untriaged`` in the census: a false alarm or a new bug.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    model_type: str
    prop: str
    summary: str
    witness: str  # tests/helpers/census_witness.py::<witness>, called with the model type


_FALCON = ("Falcon (no ALiBi) under sdpa with output_attentions=True takes its eager branch and adds sdpa's boolean "
           "mask to the scores (+1/+0) instead of masking: the pattern sees future and padded keys (the zoo's finding; "
           "the plain forward is causal).")
_POSITIONS = ("its causal-LM forward takes no position_ids and numbers learned positions by index, so a masked "
              "left pad moves every real token one position on (the mask itself works: the pad's id changes "
              "nothing); left-padded batches give other logits than the unpadded prompt.")
_LEAK = ("a masked pad's token id reaches the real tokens (MobileBERT's trigram input convolution, ConvBERT's span "
         "convolution, YOSO's hashed attention): the pad is not fully masked.")
_MOSHI = ("MoshiConfig declares sliding_window (3000 by default, 'Sliding window attention window size'), but "
          "MoshiModel masks with create_causal_mask and MoshiAttention passes no sliding_window to its attention "
          "function: no window is applied, every query sees every earlier key.")
LEFT_PAD_MOVES = ("bart", "bigbird_pegasus", "blenderbot", "blenderbot-small", "marian", "mbart", "mvp", "pegasus",
                  "plbart", "prophetnet", "trocr", "whisper")
PAD_LEAKS = ("convbert", "mobilebert", "yoso")
FINDINGS: tuple[Finding, ...] = (
    Finding("falcon", "causal_pattern", _FALCON, "falcon_census"),
    Finding("falcon", "padding_pattern", _FALCON, "falcon_census"),
    *(Finding(t, "padding_outputs", _POSITIONS, "left_padding_moves_positions") for t in LEFT_PAD_MOVES),
    *(Finding(t, "padding_outputs", _LEAK, "padding_leaks_into_real_tokens") for t in PAD_LEAKS),
    Finding("moshi", "sliding_window", _MOSHI, "window_ignored"),
)


def for_type(model_type: str) -> dict[str, Finding]:
    return {f.prop: f for f in FINDINGS if f.model_type == model_type}
