"""Head redundancy probes: importance, pruning curves, similarity, roles and attention entropy.

Every probe talks to a model only through the model protocol (docs/architecture.md): it gates heads
with hooks on ``blocks.{l}.attn.hook_z`` and reads ``blocks.{l}.attn.hook_pattern``, so it runs on
attnlab's ``Transformer``, on any protocol ``HookedRootModule`` and on a ``TransformerBridge``. On an
encoder-decoder (``cfg.is_encoder_decoder``: attnlab's ``EncoderDecoder``, a Hugging Face BART, T5, Marian ...)
every head probe covers its three stacks, encoder self-attention, decoder self-attention and cross-attention,
each through its own ``hook_z``/``hook_pattern``, given ``source_tokens``/``source_mask``; per-head frames lead
with a ``kind`` column (docs/architecture.md, "Probe result values").

Ablating a head means replacing its output (``hook_z``, before the output projection) by zero,
or by its per-position mean over the data (mean ablation); a head's importance is how much the
next-token loss rises when it is ablated, or its gradient-based estimate (Michel, Levy & Neubig
2019). Pruning removes heads cumulatively in importance order and compares with random orders;
``redundancy`` condenses that into the fraction of heads a model does not need. All of it is one
mechanism, :mod:`probes.gates`: many head masks per forward pass, prefix residuals reused.

``tokens`` is an integer tensor ``[n, pos]``; ``loss_mask[i, t] = 1`` makes token t a target
(predicted from position t-1); ``attention_mask`` (1 real, 0 padding) is passed to the model.
Results are pandas DataFrames / Series.

Under ``torchrun`` (a torch.distributed process group: gloo on CPU, nccl on GPU) the mask-evaluating
probes split their passes across the ranks and every rank returns the one-process result, bit for
bit (:mod:`probes._shard`); gradient importance, one forward and backward, runs whole on each rank.
"""

from probes.attribution import Attribution, attribution_scores
from probes.compare import ESTIMATOR_COLUMNS, compare_estimators
from probes.entropy import attention_entropy
from probes.importance import head_importance
from probes.l0_gates import L0Options
from probes.patching import patch_residual
from probes.patterns import attention_patterns
from probes.pruning import prune_curve, redundancy
from probes.roles import head_roles
from probes.similarity import head_similarity

__all__ = ["attribution_scores", "Attribution", "attention_patterns",
           "head_importance", "patch_residual", "L0Options", "prune_curve", "redundancy", "head_similarity",
           "head_roles", "attention_entropy", "compare_estimators", "ESTIMATOR_COLUMNS"]
