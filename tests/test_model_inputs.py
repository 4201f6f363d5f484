"""Bad forward / generate input is refused before any compute, with the value named."""

import pytest
import torch

from harness import ModelConfig, Transformer


@pytest.fixture(scope="module")
def model():
    return Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=20, n_ctx=8)).eval()


@pytest.fixture
def spy(model):
    """Counts embedding lookups so a test can assert that nothing was computed."""
    calls = []
    handle = model.embed.register_forward_hook(lambda *a: calls.append(1))
    yield calls
    handle.remove()


OK = torch.zeros(2, 4, dtype=torch.long)

BAD_TOKENS = [
    (torch.zeros(2, 4), ValueError, "dtype torch.float32"),
    (torch.zeros(2, 4, dtype=torch.bool), ValueError, "dtype torch.bool"),
    (torch.zeros(4, dtype=torch.long), ValueError, r"shape \(4,\): expected 2-D"),
    (torch.zeros(1, 2, 4, dtype=torch.long), ValueError, r"shape \(1, 2, 4\)"),
    (torch.zeros(2, 0, dtype=torch.long), ValueError, r"shape \(2, 0\)"),
    (torch.tensor([[1, -1]]), ValueError, r"token id -1 is out of range: expected ids in \[0, 20\)"),
    (torch.tensor([[1, 20]]), ValueError, r"token id 20 is out of range"),
    ([[1, 2]], TypeError, "got list"),
    (torch.zeros(1, 9, dtype=torch.long), ValueError, "position 8 .* n_ctx=8"),
]


@pytest.mark.parametrize("tokens, exc, needle", BAD_TOKENS)
def test_bad_tokens(model, spy, tokens, exc, needle):
    with pytest.raises(exc, match=needle):
        model(tokens)
    assert spy == []


BAD_MASKS = [
    (torch.ones(2, 5, dtype=torch.long), ValueError, r"shape \(2, 5\): expected \[batch, pos\] = \(2, 4\)"),
    (torch.ones(4, dtype=torch.long), ValueError, r"shape \(4,\)"),
    (torch.ones(2, 4), ValueError, "dtype torch.float32"),
    (torch.full((2, 4), 2), ValueError, "values other than 0 and 1"),
    ("1111", TypeError, "got str"),
]


@pytest.mark.parametrize("mask, exc, needle", BAD_MASKS)
def test_bad_attention_mask(model, spy, mask, exc, needle):
    with pytest.raises(exc, match=needle):
        model(OK, attention_mask=mask)
    assert spy == []


@pytest.mark.parametrize("offset", [-1, 1.5, True, "3"])
def test_bad_position_offset(model, spy, offset):
    with pytest.raises(ValueError, match=f"position_offset={offset!r}"):
        model(OK, position_offset=offset)
    assert spy == []


def test_offset_past_learned_table(model, spy):
    with pytest.raises(ValueError, match=r"position 8 \(position_offset=5.*n_ctx=8"):
        model(OK, position_offset=5)
    assert spy == []
    assert model(OK, position_offset=4).shape == (2, 4, 20)


def test_left_padding_does_not_count_towards_the_table(model):
    tokens = torch.zeros(1, 10, dtype=torch.long)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1, 1]])
    assert model(tokens, attention_mask=mask).shape == (1, 10, 20)  # 8 real tokens fit n_ctx=8


def test_bad_layer_arguments(model):
    with pytest.raises(ValueError, match="stop_at_layer=2 is invalid"):
        model(OK, stop_at_layer=2)
    with pytest.raises(ValueError, match="must be a float residual stream"):
        model(OK, start_at_layer=0)


@pytest.mark.parametrize("kwargs, needle", [
    (dict(max_new_tokens=-1), "max_new_tokens=-1"),
    (dict(max_new_tokens=2, temperature=-0.5), "temperature=-0.5"),
    (dict(max_new_tokens=2, top_k=0), "top_k=0"),
    (dict(max_new_tokens=2, top_k=21), "top_k=21"),
    (dict(max_new_tokens=6), "n_ctx=8"),
])
def test_bad_generate_arguments(model, spy, kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        model.generate(OK, **kwargs)
    assert spy == []


def test_generate_refuses_bidirectional_models():
    model = Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=20, attention_dir="bidirectional"))
    with pytest.raises(ValueError, match="attention_dir='bidirectional'"):
        model.generate(OK, 2)


def test_model_rejects_non_config():
    with pytest.raises(TypeError, match="expects a harness.ModelConfig, got dict"):
        Transformer({"n_layers": 2})
