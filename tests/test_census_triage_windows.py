"""Census triage: windows, position types and offsets read as the model declares them.

Each test builds the census's own tiny model of one type (reports.census.shrink.build) and asserts
the adapter's declared design, then that the check it feeds passes on it and fails once the
declaration is the one the adapter used to read (so the check still tells the two apart).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import properties
from harness.adapters import UnsupportedInput, adapt, hf_routes
from reports.census.enumerate import by_name
from reports.census.shrink import build

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(model_type: str):
    mt = by_name()[model_type]
    return build(mt.name, mt.class_name)


def status(adapter, prop: str) -> str:
    frame = properties.check_model(adapter, seed=0, max_examples=3, properties=[prop])
    return {r.property: r.status for r in frame.itertuples()}[prop]


@pytest.mark.parametrize("model_type", ["exaone4", "ultrabert"])
def test_window_is_the_masks_not_the_flash_kwarg(model_type):
    """Exaone 4 keeps module.sliding_window on its full layer, UltraBERT stores w + 1 there for flash attention:
    the eager/sdpa mask follows config.layer_types and config.sliding_window, and so does the declared window."""
    model = tiny(model_type)
    config, adapter = model.config, adapt(model)
    expected = tuple(config.sliding_window if t == "sliding_attention" else None
                     for t in config.layer_types[:adapter.cfg.n_layers])
    assert adapter.cfg.sliding_window == expected and any(w is not None for w in expected)
    assert status(adapter, "sliding_window") == "pass"
    # what the adapter read before, the module's own attribute, fails the exact check
    modules = [a for a in model.modules() if hasattr(a, "sliding_window") and hasattr(a, "q_proj")]
    module_windows = tuple(int(a.sliding_window) if a.sliding_window is not None else None for a in modules)
    assert module_windows != expected
    adapter._cfg = dataclasses.replace(adapter.cfg, sliding_window=module_windows)
    assert status(adapter, "sliding_window") == "fail"


def test_ctrl_declares_its_sinusoidal_buffer():
    """CTRL adds a fixed sine/cosine buffer (pos_encoding), not a module: sinusoidal, so relative_position
    (for models without absolute positions) does not apply, and an offset does move its logits."""
    adapter = adapt(tiny("ctrl"))
    assert adapter.cfg.positional_embedding_type == "sinusoidal"
    assert status(adapter, "relative_position") == "n/a"
    tokens = torch.tensor([[3, 5]])
    with torch.no_grad():
        moved = (adapter(tokens) - adapter(tokens, position_offset=1)).abs().max()
    assert float(moved) > 1e-3


def test_an_offset_the_model_cannot_take_is_unobservable():
    """MOSS's wrapper forward takes no position_ids: an offset is a valid protocol input the adapter cannot pass
    on (UnsupportedInput), so relative_position is unobservable, not failed."""
    adapter = adapt(tiny("moss_transcribe_diarize"))
    with pytest.raises(UnsupportedInput, match="position_offset=1 cannot be given"):
        adapter(torch.tensor([[3, 5]]), position_offset=1)
    assert status(adapter, "relative_position") == "unobservable"


def test_block_attention_over_depth_is_not_the_layers_attention():
    """Inkling 2's BlockAttentionResidual (a learned query over earlier layers' outputs, one token at a time, no
    projection) sits ahead of self_attn in each block: the adapter hooks self_attn, which is causal."""
    model = tiny("inkling2_text")
    layers = hf_routes.find_layers(model, model.config.num_hidden_layers)
    chosen = [type(hf_routes.attention_module(layer)).__name__ for layer in layers]
    assert all(name.endswith(("SlidingAttention", "FullAttention")) for name in chosen), chosen
    assert adapt(model).cfg.attention_dir == "causal"


def test_eager_decoder_with_is_causal_unset_is_causal():
    """BigBirdPegasus's decoder self-attention keeps is_causal=False (read only by sdpa/flash without a mask), but
    runs eager on the mask create_causal_mask builds: causal, so attention_scale expects its future keys masked."""
    adapter = adapt(tiny("bigbird_pegasus"))
    assert adapter.cfg.attention_dir == "causal"
    assert status(adapter, "attention_scale") == "pass"


def test_pegasus_x_positions_reach_its_table():
    """PEGASUS-X's decoder passes its position ids positionally as a column, its encoder none: the protocol's
    positions (left-padded source, decoder offset) reach the table in the layout it takes."""
    adapter = adapt(tiny("pegasus_x"))
    tokens, source = torch.tensor([[3, 5], [4, 6]]), torch.tensor([[0, 7, 8], [9, 7, 8]])
    source_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    with torch.no_grad():
        plain = adapter(tokens, source_tokens=source, source_mask=source_mask)
        moved = adapter(tokens, position_offset=1, source_tokens=source, source_mask=source_mask)
    assert plain.shape == (2, 2, adapter.cfg.d_vocab) and bool(torch.isfinite(plain).all())
    assert float((plain - moved).abs().max()) > 1e-4  # the offset moved the decoder's sinusoidal positions
    assert status(adapter, "cross_kv_cache") == "pass"
