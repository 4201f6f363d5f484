"""Bad forward input is refused before any compute, in one wording at every entry that takes it.

The checks live in harness.model.inputs; the table below runs each bad input through every entry
(the model's forward, both adapters' forwards, every probe) and expects the same message, so a
second copy of a validator with its own wording cannot come back unnoticed.
"""

import pytest
import torch

import probes
from harness import ModelConfig, Transformer
from harness.adapters import BridgeAdapter, HFAdapter
from tests.helpers.hf_models import VOCAB, gpt2

N_CTX = 32  # the helper GPT-2's n_positions; the Transformer gets the same table
OK = torch.zeros(2, 4, dtype=torch.long)
# Exact messages; {min_pos} is the entry's shortest input (2 for the probes that score next-token loss).
BAD_INPUTS = [
    ("float tokens", OK.float(), None, ValueError,
     "tokens have dtype torch.float32: expected an integer dtype (token ids, e.g. torch.long)"),
    ("bool tokens", OK.bool(), None, ValueError,
     "tokens have dtype torch.bool: expected an integer dtype (token ids, e.g. torch.long)"),
    ("rank 1", OK[0], None, ValueError, "tokens have shape (4,) (rank 1): expected rank 2 [batch, pos]"),
    ("rank 3", OK[None], None, ValueError, "tokens have shape (1, 2, 4) (rank 3): expected rank 2 [batch, pos]"),
    ("no positions", OK[:, :0], None, ValueError,
     "tokens have shape (2, 0): expected at least 1 sequence and {min_pos} position(s)"),
    ("negative id", OK - 1, None, ValueError, f"token id -1 is out of range: expected ids in [0, {VOCAB}) (d_vocab)"),
    ("id past vocab", OK + VOCAB, None, ValueError,
     f"token id {VOCAB} is out of range: expected ids in [0, {VOCAB}) (d_vocab)"),
    ("list tokens", OK.tolist(), None, TypeError, "tokens must be a torch.Tensor of token ids [batch, pos], got list"),
    ("mask shape", OK, torch.ones(2, 5, dtype=torch.long), ValueError,
     "attention_mask has shape (2, 5): expected [batch, pos] = (2, 4), the shape of tokens"),
    ("mask rank", OK, torch.ones(4, dtype=torch.long), ValueError,
     "attention_mask has shape (4,): expected [batch, pos] = (2, 4), the shape of tokens"),
    ("float mask", OK, torch.ones(2, 4), ValueError,
     "attention_mask has dtype torch.float32: expected bool or integer 0/1"),
    ("mask values", OK, torch.full((2, 4), 2), ValueError, "attention_mask holds the value 2: expected only 0 and 1"),
    ("str mask", OK, "1111", TypeError, "attention_mask must be a torch.Tensor [batch, pos] = (2, 4), got str"),
]
LOSS_PROBES = ("head_importance", "prune_curve", "redundancy")
PROBES = LOSS_PROBES + ("head_similarity", "head_roles", "attention_entropy")
FORWARDS = ("Transformer", "HFAdapter", "BridgeAdapter")


@pytest.fixture(scope="module")
def model():
    return Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=VOCAB, n_ctx=N_CTX)).eval()


@pytest.fixture(scope="module")
def wrapped(model):
    """entry -> (the protocol model it calls, the inner module whose forward would mean work was done)."""
    pytest.importorskip("transformer_lens.model_bridge")
    hf = HFAdapter(gpt2())
    bridge = BridgeAdapter.from_hf(gpt2())
    return {"Transformer": (model, model.embed), "HFAdapter": (hf, hf.hf_model),
            "BridgeAdapter": (bridge, bridge.bridge)}


def run_entry(entry, wrapped, model, tokens, mask, offset=0):
    if entry in FORWARDS:
        target, inner = wrapped[entry]
        call = lambda: target(tokens, attention_mask=mask, position_offset=offset)  # noqa: E731
    else:
        inner = model
        call = lambda: getattr(probes, entry)(model, tokens, attention_mask=mask)  # noqa: E731
    calls = []
    handle = inner.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with torch.no_grad():
            call()
    finally:
        handle.remove()
        assert calls == [], f"{entry} ran a forward pass before refusing the input"


@pytest.mark.parametrize("entry", FORWARDS + PROBES)
@pytest.mark.parametrize(("tokens", "mask", "error", "message"), [c[1:] for c in BAD_INPUTS],
                         ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_gets_one_message_at_every_entry(wrapped, model, entry, tokens, mask, error, message):
    with pytest.raises(error) as info:
        run_entry(entry, wrapped, model, tokens, mask)
    assert str(info.value) == message.format(min_pos=2 if entry in LOSS_PROBES else 1)


@pytest.mark.parametrize("entry", FORWARDS)
@pytest.mark.parametrize("offset", [-1, 1.5, True, "3"])
def test_bad_position_offset(wrapped, model, entry, offset):
    with pytest.raises(ValueError) as info:
        run_entry(entry, wrapped, model, OK, None, offset)
    assert str(info.value) == f"position_offset={offset!r} is invalid: expected an integer >= 0"


@pytest.mark.parametrize("entry", FORWARDS)
def test_positions_past_the_learned_table(wrapped, model, entry):
    with pytest.raises(ValueError, match=rf"^position {N_CTX + 1}\b.* is past the learned position table: "
                                         rf"expected positions < n_ctx={N_CTX}$"):
        run_entry(entry, wrapped, model, OK, None, N_CTX - 2)
    target, _ = wrapped[entry]
    left_padded = torch.tensor([[1] * 2 + [1] * N_CTX])  # 2 pads + n_ctx real tokens: positions 0 .. n_ctx - 1
    mask = torch.tensor([[0] * 2 + [1] * N_CTX])
    with torch.no_grad():
        assert target(left_padded, attention_mask=mask).shape == (1, N_CTX + 2, VOCAB)


def test_the_model_says_where_a_position_past_its_table_came_from(model):
    with pytest.raises(ValueError, match=rf"^position {N_CTX} \(position_offset=29, 0 cached\) is past"):
        model(OK, position_offset=N_CTX - 3)
    assert model(OK, position_offset=N_CTX - 4).shape == (2, 4, VOCAB)


@pytest.fixture
def spy(model):
    """Counts embedding lookups so a test can assert that nothing was computed."""
    calls = []
    handle = model.embed.register_forward_hook(lambda *a: calls.append(1))
    yield calls
    handle.remove()


def test_bad_layer_arguments(model):
    with pytest.raises(ValueError, match="stop_at_layer=2 is invalid"):
        model(OK, stop_at_layer=2)
    with pytest.raises(ValueError, match="must be a float residual stream"):
        model(OK, start_at_layer=0)


@pytest.mark.parametrize("kwargs, needle", [
    (dict(max_new_tokens=-1), "max_new_tokens=-1"),
    (dict(max_new_tokens=2, temperature=-0.5), "temperature=-0.5"),
    (dict(max_new_tokens=2, top_k=0), "top_k=0"),
    (dict(max_new_tokens=2, top_k=VOCAB + 1), f"top_k={VOCAB + 1}"),
    (dict(max_new_tokens=N_CTX - 2), f"n_ctx={N_CTX}"),
])
def test_bad_generate_arguments(model, spy, kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        model.generate(OK, **kwargs)
    assert spy == []


def test_generate_refuses_bidirectional_models():
    model = Transformer(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_vocab=VOCAB, attention_dir="bidirectional"))
    with pytest.raises(ValueError, match="attention_dir='bidirectional'"):
        model.generate(OK, 2)


def test_model_rejects_non_config():
    with pytest.raises(TypeError, match="expects a harness.ModelConfig, got dict"):
        Transformer({"n_layers": 2})
