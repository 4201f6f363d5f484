"""Every default of the ``attnlab`` commands and of the stages behind them, owned here once.

The click options (:mod:`reports.cli`), the pipeline functions (:mod:`reports.pipeline`,
:mod:`reports.heal`) and the report's headline read these names, so ``attnlab probe`` and
``pipeline.probe()`` cannot drift apart; tests/test_cli_defaults.py compares every click default
with the signature of the function it calls. Model and training defaults are not here: they are
the preset's (:mod:`harness.training.presets`), which the config options start from.
"""

from __future__ import annotations

from collections.abc import Iterable

PRESET = "induction"  # the preset unset model/train options take their values from: harness.demo_configs()
DEMO_OUT = "attnlab-demo"  # `attnlab demo`'s run directory
SATURATION_OUT = "saturation"  # `attnlab saturation`'s folder when it is not given a run directory

# check and probe: where the model runs (harness.adapters.placed)
DTYPE = "auto"  # the checkpoint's own dtype (its config's torch_dtype): the user checks what they run
DEVICE = None  # where the model loads (the CPU); e.g. "cuda:0"
ATTN_IMPLEMENTATION = None  # the checkpoint's own attention kernel (Hugging Face models: sdpa, eager, ...)

# check
MAX_EXAMPLES = 25  # hypothesis examples per property: the `ci` profile's budget
BUDGET = True  # a model over ~1.8M parameters runs fewer, within each row's pass budget (properties/budget.py)
SEED = 0  # the property searches' seed; also --hf config.json random weights and the --task batch

# probe
PROBE_SEQUENCES = 64  # validation sequences of the run's task (a fixed batch: see pipeline.PROBE_DATA_SEED)
SEEDS = (0, 1, 2)  # random prune orders (and the saturation sweep's seeds)
TOLERANCE = 0.01  # the prune budget of the headline: loss may rise by at most 1% (relative)
TOP_K_PATTERNS = 4  # most important heads whose attention patterns are saved
PROBE_RUN_METHODS = None  # every method of reports.probe_run.plan.METHODS
# The probe's time budget in minutes: everything exact where it fits (every small model), cheaper variants
# named in the printed plan where not; 10 min is the goal for a 135M checkpoint on 2 cores.
PROBE_BUDGET = 10.0
PROBE_EXACT_TOP = 8  # heads whose exact leave-one-out a "top candidates" variant computes

# saturation
SATURATION_D_HEADS = (8, 16, 32, 64, 128, 256, 512)

# heal
HEAL_FRACTIONS = (0.25, 0.5, 0.75)
HEAL_STEPS = 200
HEAL_TEMPERATURE = 2.0  # Hinton et al. (2015): T > 1 softens the teacher's distribution
HEAL_ALPHA = 0.5  # weight of the distillation loss against the hard labels
HEAL_SEEDS = (0,)  # random prune orders healed as the baseline
HEAL_DIR = "heal"  # the healed runs' folder inside the run, when --out is not given

BENCH_DEVICE = "auto"  # CUDA when available, else CPU


def comma(values: Iterable[object]) -> str:
    """A tuple default as the command line spells it (``(0, 1, 2)`` -> ``"0,1,2"``)."""
    return ",".join(str(v) for v in values)
