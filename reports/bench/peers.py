"""The interpretability work users do, in attnlab and in what they would pick instead.

Three tasks on one random Hugging Face GPT-2 (built in memory from a config), each written the way
its library's documentation shows, all giving the same numbers (checked to 1e-4 before timing):

- cache every attention pattern: attnlab ``probes.attention_patterns`` (the pass ends at the last
  layer's pattern); TransformerLens's bridge
  ``run_with_cache``; nnsight a trace saving every attention module's weights (eager attention);
- leave-one-out ablation of every head (the loss change when its ``hook_z`` slice is zeroed):
  attnlab ``probes.head_importance(method="ablation")`` (batched masks, prefix reuse); the bridge
  one ``run_with_hooks`` per head; nnsight one trace per head setting the head's slice of the
  output projection's input to zero;
- activation patching of the residual stream over layers x positions (corrupted run, one
  position's ``resid_pre`` taken from the clean run; metric: the answer's log-probability at the
  last position): attnlab ``probes.patch_residual``; the bridge TransformerLens's
  ``patching.get_act_patch_resid_pre`` (over some positions: the ``generic_activation_patch`` it
  specialises, with its setter, over an ``index_df`` of (layer, pos) cells); nnsight one trace per
  (layer, position) patching the block's input.

Beside the peers, each task's floor (reports/bench/floors.py: the same numbers from plain calls of the
converted model) is timed in the same rounds: attnlab's time over the floor's is the price of its machinery.

attnlab runs GPT-2 as :func:`harness.model.convert.from_hf` converts it (the same weights in
attnlab's ``Transformer``, logits equal to Hugging Face's to ~1e-5).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any, Optional

import pandas as pd
import torch
from torch import Tensor, nn
from transformer_lens import patching
from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

import probes
import probes.patching
from harness.adapters import HFAdapter
from harness.model.convert import from_hf
from reports.bench.core import Row, Shape, interleaved_times, medians, paired_ratio
from reports.bench.floors import Floor, answer_logprob, loss

TASKS = ("patterns", "loo_ablation", "resid_patching")
FLOOR_GOALS = {"patterns": 1.15, "loo_ablation": 1.3, "resid_patching": 1.3}  # attnlab's time / the floor's, at most
ANSWER = 7  # the token whose last-position log-probability the patching metric reads


def gpt2_models(shape: Shape, seed: int = 0) -> tuple[nn.Module, nn.Module, nn.Module]:
    """``(hf_for_nnsight, hf_for_bridge, hf_for_attnlab)``: three copies of the same random GPT-2.

    Separate copies because the bridge replaces its model's submodules in place and nnsight needs
    eager attention to expose the weights; dropout 0, eval mode.
    """
    config = GPT2Config(n_layer=shape.n_layers, n_embd=shape.d_model, n_head=shape.n_heads, n_positions=shape.n_ctx,
                        vocab_size=shape.d_vocab, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=0, eos_token_id=0)
    models = []
    for _ in range(3):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            # a config each: set_attn_implementation writes to the config object
            models.append(GPT2LMHeadModel(copy.deepcopy(config)).eval())
    models[0].set_attn_implementation("eager")
    return models[0], models[1], models[2]


def _answer_logprob(logits: Tensor) -> Tensor:
    return answer_logprob(logits, ANSWER)


class Attnlab:
    """attnlab's calls: the probes on the converted model."""

    name = "attnlab"

    def __init__(self, hf: Any):  # a Hugging Face GPT-2 (its config and module tree are untyped)
        self.model = from_hf(hf).eval()
        self.n_layers, self.n_heads = self.model.cfg.n_layers, self.model.cfg.n_heads

    def patterns(self, tokens: Tensor) -> Tensor:
        return probes.attention_patterns(self.model, tokens)

    def loo_ablation(self, tokens: Tensor) -> Tensor:
        imp = probes.head_importance(self.model, tokens, method="ablation")
        return torch.tensor(imp["loss_delta"].to_numpy()).view(self.n_layers, self.n_heads)

    def resid_patching(self, clean: Tensor, corrupted: Tensor, positions: Sequence[int]) -> Tensor:
        out = probes.patching.patch_residual(self.model, clean, corrupted, _answer_logprob, positions=list(positions))
        return out[:, list(positions)]


class Bridge:
    """TransformerLens's ``TransformerBridge`` (compatibility mode), its documented calls."""

    name = "bridge"

    def __init__(self, hf: Any):  # a Hugging Face GPT-2 (its config and module tree are untyped)
        self.model = build_bridge_from_module(hf, "GPT2LMHeadModel", hf_config=hf.config)
        self.model.enable_compatibility_mode()
        self.model.eval()
        self.n_layers, self.n_heads = hf.config.n_layer, hf.config.n_head

    def _logits(self, out: Any) -> Tensor:
        return out if isinstance(out, Tensor) else out.logits

    def patterns(self, tokens: Tensor) -> Tensor:
        with torch.no_grad():
            _, cache = self.model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
        return torch.stack([cache[f"blocks.{layer}.attn.hook_pattern"] for layer in range(self.n_layers)])

    def loo_ablation(self, tokens: Tensor) -> Tensor:
        out = torch.empty(self.n_layers, self.n_heads, dtype=torch.float64)
        with torch.no_grad():
            base = float(loss(self._logits(self.model(tokens)), tokens))
            for layer in range(self.n_layers):
                for head in range(self.n_heads):
                    def ablate(z: Tensor, hook: Any, head: int = head) -> Tensor:
                        z[:, :, head] = 0
                        return z
                    logits = self.model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", ablate)])
                    out[layer, head] = float(loss(self._logits(logits), tokens)) - base
        return out

    def resid_patching(self, clean: Tensor, corrupted: Tensor, positions: Sequence[int]) -> Tensor:
        with torch.no_grad():
            _, cache = self.model.run_with_cache(clean, names_filter=lambda n: n.endswith("hook_resid_pre"))
            metric = lambda out: _answer_logprob(self._logits(out))  # noqa: E731
            if list(positions) == list(range(clean.shape[1])):  # every position: the documented call as it is
                return patching.get_act_patch_resid_pre(self.model, corrupted, cache, metric).double().cpu()
            # some positions: the same function over the (layer, pos) cells its index_df names
            cells = pd.DataFrame([(layer, p) for layer in range(self.n_layers) for p in positions],
                                 columns=["layer", "pos"])
            out = patching.generic_activation_patch(self.model, corrupted, cache, metric,
                                                    patch_setter=patching.layer_pos_patch_setter,
                                                    activation_name="resid_pre", index_df=cells)
            return out.double().cpu().view(self.n_layers, len(positions))


class Nnsight:
    """nnsight's ``NNsight`` wrapper around the Hugging Face model, traces as its tutorials write them."""

    name = "nnsight"

    def __init__(self, hf: Any):  # a Hugging Face GPT-2 (its config and module tree are untyped)
        from nnsight import NNsight  # an optional peer (the test extra): only this class needs it

        self.model = NNsight(hf)
        self.n_layers, self.n_heads = hf.config.n_layer, hf.config.n_head
        self.d_head = hf.config.n_embd // hf.config.n_head

    def patterns(self, tokens: Tensor) -> Tensor:
        saved = []
        with torch.no_grad(), self.model.trace(tokens):
            for layer in range(self.n_layers):
                saved.append(self.model.transformer.h[layer].attn.output[1].save())
        return torch.stack(list(saved))

    def loo_ablation(self, tokens: Tensor) -> Tensor:
        out = torch.empty(self.n_layers, self.n_heads, dtype=torch.float64)
        d = self.d_head
        with torch.no_grad():
            with self.model.trace(tokens):
                base_logits = self.model.lm_head.output.save()
            base = float(loss(base_logits, tokens))
            for layer in range(self.n_layers):
                for head in range(self.n_heads):
                    with self.model.trace(tokens):
                        self.model.transformer.h[layer].attn.c_proj.input[:, :, head * d:(head + 1) * d] = 0
                        logits = self.model.lm_head.output.save()
                    out[layer, head] = float(loss(logits, tokens)) - base
        return out

    def resid_patching(self, clean: Tensor, corrupted: Tensor, positions: Sequence[int]) -> Tensor:
        out = torch.empty(self.n_layers, len(positions), dtype=torch.float64)
        clean_in = []
        with torch.no_grad():
            with self.model.trace(clean):
                for layer in range(self.n_layers):
                    clean_in.append(self.model.transformer.h[layer].input.save())
            for layer in range(self.n_layers):
                for i, p in enumerate(positions):
                    with self.model.trace(corrupted):
                        self.model.transformer.h[layer].input[:, p] = clean_in[layer][:, p]
                        logits = self.model.lm_head.output.save()
                    out[layer, i] = float(_answer_logprob(logits))
        return out


def corrupt(tokens: Tensor, d_vocab: int) -> Tensor:
    """The corrupted input: every sequence's first token replaced by another id."""
    out = tokens.clone()
    out[:, 0] = (out[:, 0] + d_vocab // 2) % d_vocab
    return out


def peer_rows(shape: Shape, rounds: int, checks: dict, tasks: tuple[str, ...] = TASKS,
              positions: Optional[Sequence[int]] = None) -> list[Row]:
    """One row per (task, peer): the peer's time / attnlab's time, goal >= 1.5; then one per task: attnlab's time /
    its floor's (:data:`FLOOR_GOALS`). ``positions``: the positions residual patching patches at every layer
    (default all)."""
    where = list(range(shape.n_ctx)) if positions is None else list(positions)
    hf_nn, hf_bridge, hf_ours = gpt2_models(shape)
    ours = Attnlab(hf_ours)
    contenders: list[Any] = [ours, Bridge(hf_bridge), Nnsight(hf_nn), Floor(ours.model, ANSWER)]
    tokens = shape.tokens(torch.device("cpu"))
    corrupted = corrupt(tokens, shape.d_vocab)
    calls: dict[str, Callable[[Any], Callable[[], Tensor]]] = {
        "patterns": lambda c: lambda: c.patterns(tokens),
        "loo_ablation": lambda c: lambda: c.loo_ablation(tokens),
        "resid_patching": lambda c: lambda: c.resid_patching(tokens, corrupted, where),
    }
    rows = []
    for task in tasks:
        fns = {c.name: calls[task](c) for c in contenders}
        results = {name: fn() for name, fn in fns.items()}  # also the warm-up
        for name in ("bridge", "nnsight", "floor"):
            err = float((results[name].double().cpu() - results["attnlab"].double().cpu()).abs().max())
            checks[f"{task}_{name}_max_abs"] = err
            if not err <= 1e-4:
                raise AssertionError(f"{task}: {name} and attnlab disagree by {err:.3g} (> 1e-4): "
                                     "the timing would compare different computations")
        times = interleaved_times(fns, rounds=rounds, warmup=0)
        med = medians(times)
        label = shape.label + (f", {len(where)} of {shape.n_ctx} positions"
                               if task == "resid_patching" and len(where) < shape.n_ctx else "")
        for name in ("bridge", "nnsight"):
            rows.append(Row(f"{task} vs {name}, GPT-2 {label}", med["attnlab"], med[name], "s",
                            paired_ratio(times, name, "attnlab"), ">=", 1.5))
        rows.append(Row(f"{task} vs floor, GPT-2 {label} (attnlab / floor)", med["attnlab"], med["floor"], "s",
                        paired_ratio(times, "attnlab", "floor"), "<=", FLOOR_GOALS[task]))
    return rows


def _llama(shape: Shape, seed: int) -> nn.Module:
    config = LlamaConfig(vocab_size=shape.d_vocab, hidden_size=shape.d_model, intermediate_size=4 * shape.d_model,
                         num_hidden_layers=shape.n_layers, num_attention_heads=shape.n_heads,
                         num_key_value_heads=max(1, shape.n_heads // 2), max_position_embeddings=shape.n_ctx,
                         bos_token_id=0, eos_token_id=0, pad_token_id=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config).eval()


def adapter_rows(shape: Shape, rounds: int, checks: dict) -> list[Row]:
    """HFAdapter's forward with idle hooks / the same Hugging Face model's own forward (goal <= 1.05).

    Two copies of one random model (GPT-2 and Llama): the adapter points its copy at its own
    attention function, the other copy keeps transformers' sdpa. Logits must agree first.
    """
    rows = []
    builders = {"GPT-2": lambda: gpt2_models(shape)[2], "Llama": lambda: _llama(shape, 0)}
    tokens = shape.tokens(torch.device("cpu"))
    for arch, build in builders.items():
        plain, adapter = build(), HFAdapter(build())
        with torch.no_grad():
            err = float((adapter(tokens) - plain(tokens).logits).abs().max())
        checks[f"adapter_{arch}_logits_max_abs"] = err
        if not err <= 1e-4:
            raise AssertionError(f"HFAdapter({arch}) logits differ from the model's own by {err:.3g} (> 1e-4)")

        def call(fn: Callable[[Tensor], Any]) -> Callable[[], None]:
            def run() -> None:
                with torch.no_grad():
                    fn(tokens)
            return run

        times = interleaved_times({"adapter": call(adapter), "plain": call(plain)}, rounds=rounds)
        med = medians(times)
        rows.append(Row(f"HFAdapter forward (idle hooks) / HF forward, {arch} {shape.label}", med["adapter"],
                        med["plain"], "s", paired_ratio(times, "adapter", "plain"), "<=", 1.05))
    return rows
