"""The hand-built rule-head model (tests/helpers/fixed_pattern.py) the closed-form probe checks rely on."""

import torch

from tests.helpers.fixed_pattern import FixedPatternModel, rule_pattern


def test_rule_patterns_are_causal_distributions():
    tokens = torch.tensor([[1, 2, 1, 2, 3], [4, 4, 4, 5, 5]])
    real = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]], dtype=torch.bool)
    for rule in FixedPatternModel.RULES:
        p = rule_pattern(rule, tokens, real)
        torch.testing.assert_close(p.sum(-1), torch.ones(2, 5))  # rows are distributions
        assert (p.triu(1) == 0).all()  # causal
    model = FixedPatternModel()
    assert {f"blocks.0.attn.{n}" for n in ("hook_z", "hook_pattern")} <= set(model.hook_dict)
    assert model(tokens, attention_mask=real.long()).shape == (2, 5, 12)
