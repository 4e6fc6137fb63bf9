"""``run(cfg)``: a GRPO run with speculative rollouts, on the pipeline the config names.

1. build the task splits, tokenizer, policy (supervised warm start) and drafter (distilled from the policy);
2. for each step: sample prompts, generate ``group_size`` responses per prompt with the rollout engine
   (speculative by default), score them, compute group-normalised advantages, drop all-equal groups
   (dynamic sampling), recompute old log-probs with the trainer's policy, take clipped GRPO gradient
   steps, adapt the drafter on the fresh rollouts and push the new weights to the engine (weight sync);
   every ``compare_every`` steps also generate the same requests autoregressively, side by side;
3. evaluate validation accuracy at the start and the end, run the AR-vs-speculative equivalence check on
   the final policy, write ``summary.json``, ``metrics.jsonl``, plots and a checkpoint.

The sync pipeline (``sync_pipeline.py``) runs the phases of a step one after the other; the async one
(``async_pipeline.py``) overlaps generation with training on Ray. Both are thin loops over the same step
pieces (``batch``, ``learn``, ``accounting``, ``evaluation``, ``session``).
"""

from __future__ import annotations

from .config import RunConfig
from .run.checks import check_run


def run(cfg: RunConfig) -> dict:
    """Run the whole pipeline; returns the summary dict (also written to ``OUT/summary.json``)."""
    check_run(cfg)  # user mistakes fail here, before any work, as one-line UsageErrors
    if cfg.pipeline == "async":
        from .pipelines.async_pipeline import run_async

        return run_async(cfg)
    from .pipelines.sync_pipeline import run_sync

    return run_sync(cfg)
