"""Slow tier: HFAdapter across the zoo of tiny random HF architectures (logits, route, hooks that fire).

Tolerance atol 1e-5 (float32): the adapter runs the model's own forward and kernel (measured 0).
"""

from __future__ import annotations

import copy
import inspect
import sys

import pytest
import torch

from harness.adapters import HFAdapter
from harness.adapters.hf_routes import routes_markdown
from tests.helpers.hf_zoo import ZOO, V

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
# modeling code that calls its own attention, not transformers' AttentionInterface (Falcon joined the interface in
# transformers 5.25: its route follows the installed modeling file)
MODULE_HOOKS = {"bloom", "gpt_neo", "xglm", "mpt", "openai"}
# hooks every route fires; the attention-interface route fires q/k/v and scores as well
ALWAYS = {"hook_z", "hook_pattern"}
INTERFACE_ALSO = {"hook_v", "hook_attn_scores", "hook_rot_q", "hook_rot_k"}


@pytest.mark.parametrize("arch", sorted(ZOO))
def test_zoo_logits_and_hooks(arch):
    torch.manual_seed(0)
    model = ZOO[arch]().eval()
    plain = copy.deepcopy(model)
    adapter = HFAdapter(model)
    own = arch in MODULE_HOOKS or (arch == "falcon" and "ALL_ATTENTION_FUNCTIONS" not in
                                   inspect.getsource(sys.modules[type(model).__module__]))
    assert adapter.route == ("module_hooks" if own else "attention_interface")
    g = torch.Generator().manual_seed(1)
    x = torch.randint(2, V, (2, 7), generator=g)  # ids >= 2: no pad token, so RoBERTa's own positions agree
    mask = torch.ones_like(x)
    mask[1, :3] = 0
    kwargs = {}
    if "position_ids" in inspect.signature(plain.forward).parameters:
        kwargs["position_ids"] = adapter.position_ids(mask, 0)
    with torch.no_grad():
        ref = plain(input_ids=x, attention_mask=mask, **kwargs).logits
        got = adapter(x, attention_mask=mask)
    torch.testing.assert_close(got[mask.bool()], ref[mask.bool()], atol=1e-5, rtol=0)
    _, cache = adapter.run_with_cache(x, attention_mask=mask)
    fired = {k.rsplit(".", 1)[-1] for k in cache if k.startswith("blocks.0.attn.")}
    assert ALWAYS <= fired
    if arch not in MODULE_HOOKS:
        rotary = adapter.cfg.positional_embedding_type == "rotary"
        assert {h for h in INTERFACE_ALSO if rotary or "rot" not in h} <= fired
    for layer in range(2):
        assert tuple(cache[f"blocks.{layer}.hook_resid_post"].shape) == (2, 7, adapter.cfg.d_model)


def test_roberta_positions_match_its_own_numbering():
    torch.manual_seed(0)
    model = ZOO["roberta"]().eval()
    plain = copy.deepcopy(model)
    adapter = HFAdapter(model)
    assert adapter.cfg.pos_offset == 2  # padding_idx 1 + 1
    x = torch.randint(2, V, (2, 7))
    with torch.no_grad():  # RoBERTa numbers positions itself from padding_idx + 1 when given none
        torch.testing.assert_close(adapter(x), plain(input_ids=x).logits, atol=1e-5, rtol=0)


def test_routes_table_names_both_routes():
    table = routes_markdown()
    assert "| llama | attention_interface |" in table and "| bloom | module_hooks |" in table
