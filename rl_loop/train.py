"""The GRPO training loop (sync pipeline): generate -> log-probs -> train, with speculative rollouts.

One frozen :class:`RunConfig` holds every knob; :func:`run` reads top to bottom:

1. build the task splits, tokenizer, policy (supervised warm start) and drafter (distilled from the policy);
2. for each step: sample prompts, generate ``group_size`` responses per prompt with the rollout engine
   (speculative by default), score them, compute group-normalised advantages, drop all-equal groups
   (dynamic sampling), recompute old log-probs with the trainer's policy, take clipped GRPO gradient
   steps, push the new weights to the engine (weight sync) and adapt the drafter on the fresh rollouts;
   every ``compare_every`` steps also generate the same requests autoregressively, side by side;
3. evaluate greedy validation accuracy at the start and the end, run the AR-vs-speculative equivalence
   check on the final policy, write ``summary.json``, ``metrics.jsonl``, plots and a checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict, dataclass, field, replace

import torch

from . import grpo
from .drafters import build_drafter, distill, problem_batches
from .engine import GenerationConfig, RolloutEngine, Rollouts, RolloutStats, resolve_verify_backend
from .model import ModelConfig, Qwen3, save_pretrained, supervised_warm_start
from .task import CharTokenizer, Problem, TaskConfig, make_splits, reward

REQUIRED_SUMMARY_KEYS = (
    "rollout_speedup", "step_speedup", "mean_accepted_length", "acceptance_by_position", "equivalence_pass",
    "equivalence_min_pvalue", "val_accuracy_start", "val_accuracy_end", "k",
)


@dataclass(frozen=True)
class RunConfig:
    """Every knob of a run (the CLI maps its flags onto these fields)."""

    out: str = "runs/latest"
    seed: int = 0
    # ~1 s a step on the 2-core target (rollouts, training, every 4th step's AR comparison): the default run
    # takes ~420 s of the 10-minute budget, ~230 s of it warm starts, evaluation and the equivalence check.
    steps: int = 192
    pipeline: str = "sync"  # sync | async
    spec: str = "chain"  # none | chain | tree
    drafter: str = "eagle3"  # eagle3 | mtp | draft_model
    k: int = 3
    backend: str = "own"  # own | vllm
    verify_backend: str = "default"  # specdec_kernels backend; "default": native if built, else reference
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    # rollouts
    prompts_per_step: int = 16
    group_size: int = 8
    temperature: float = 0.7  # rollout temperature; the trainer's log-probs use the same tempered policy
    max_new_tokens: int = 48
    max_batch: int = 32
    # optimisation
    # Adam moves every coordinate by ~lr per step whatever the gradient's signal-to-noise ratio, and one
    # 128-rollout step's policy gradient is almost all noise (cosine ~0.004 between the gradients of two
    # independent batches): at lr >= 3e-5 the random walk in the weight matrices (entries ~0.02) costs
    # more accuracy than the signal brings. 1e-5 keeps that walk small over the whole run.
    lr: float = 1e-5
    # The final RMSNorm gain scales the features fed to the tied LM head: it is the policy's inverse
    # temperature, and the one parameter whose GRPO gradient agrees across batches (cosine ~0.2: make the
    # policy surer where its mode is right). It is O(1) (matrix entries ~0.02) and its signal-to-noise
    # ratio is ~8x the matrices', so it takes lr x ~50 (scale) x ~8 (SNR); at ``lr`` it would not move.
    output_gain_lr: float = 4e-3
    lr_warmup_steps: int = 10  # linear warm-up of both learning rates (Adam's first steps are sign-like)
    minibatches: int = 2
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0
    dynamic_sampling: bool = True
    # Divide advantages by the group's reward std (GRPO) or only centre them (Dr. GRPO). With a small
    # format reward, std scaling blows up all-wrong groups (0.1 vs 0) to the size of correct-vs-wrong
    # groups and reinforces wrong answers; centring keeps the format term a nudge.
    scale_advantages: bool = False
    # warm starts and drafter adaptation
    warm_start_steps: int = 600
    warm_start_batch: int = 32
    warm_start_lr: float = 1e-3
    # The head's acceptance keeps rising with distillation: at k = 3 on the default policy, 300 / 600 / 900
    # steps give 3.36 / 3.47 / 3.57 tokens per round (~40 s per 300 steps on 2 cores).
    drafter_warm_steps: int = 900
    drafter_adapt_steps: int = 1  # online adaptation: gradient steps on the fresh rollouts (0 disables)
    drafter_adapt_every: int = 4  # ... every n RL steps (the policy drifts slowly; adaptation is not free)
    # measurement
    compare_every: int = 4  # AR rollouts of the same requests side by side every n steps (0: never)
    num_val: int = 512
    # val_accuracy: pass@1 of the policy as it samples rollouts (rollout temperature), averaged over this many
    # responses per problem with fixed Philox keys; 0: greedy. val_greedy_accuracy is always reported too.
    eval_samples: int = 4
    eval_every: int = 0  # 0: only at start and end
    equivalence: bool = True
    equivalence_prompts: int = 16
    equivalence_samples: int = 24
    checkpoint_every: int = 8
    resume: bool = False
    num_threads: int = 2  # torch intra-op threads (both cores of the 2-core target machine)
    plots: bool = True
    progress: bool = True

    def __post_init__(self) -> None:
        choices = {"pipeline": ("sync", "async"), "spec": ("none", "chain", "tree"),
                   "drafter": ("eagle3", "mtp", "draft_model"), "backend": ("own", "vllm")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 for RL rollouts, got {self.temperature}")
        if self.steps < 0 or self.k < 1 or self.group_size < 2 or self.prompts_per_step < 1:
            raise ValueError("steps >= 0, k >= 1, group_size >= 2 and prompts_per_step >= 1 are required")
        if self.eval_samples < 0:
            raise ValueError(f"eval_samples must be >= 0, got {self.eval_samples}")

    def generation(self, spec: str | None = None, temperature: float | None = None) -> GenerationConfig:
        return GenerationConfig(
            max_new_tokens=self.max_new_tokens, spec=self.spec if spec is None else spec, k=self.k,
            temperature=self.temperature if temperature is None else temperature, max_batch=self.max_batch,
            backend=verify_backend(self.verify_backend),
        )


def tiny_config(**overrides) -> RunConfig:
    """A seconds-long configuration for tests and smoke runs."""
    base = RunConfig(
        steps=1, model=ModelConfig(num_hidden_layers=2, intermediate_size=128),
        task=TaskConfig(num_train=256, num_val=16, difficulties=(1,)), prompts_per_step=2, group_size=4,
        max_new_tokens=24, warm_start_steps=20, drafter_warm_steps=5, num_val=8, compare_every=1,
        equivalence_prompts=2, equivalence_samples=8, checkpoint_every=1, plots=False, progress=False,
    )
    return replace(base, **overrides)


def verify_backend(name: str) -> str:
    """See :func:`rl_loop.engine.resolve_verify_backend`."""
    return resolve_verify_backend(name)


# ----------------------------------------------------------------------------------------------------
# Pieces of a step
# ----------------------------------------------------------------------------------------------------

def request_seeds(run_seed: int, step: int, n: int) -> list[int]:
    """Distinct int64 Philox keys for the n requests of a step (reproducible from the run seed)."""
    rng = random.Random(f"{run_seed}/{step}")
    return [rng.getrandbits(63) for _ in range(n)]


def build_batch(
    prompts: list[list[int]], responses: list[list[int]], finished: list[bool], tok: CharTokenizer
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [N, T] padded prompt + response (+ EOS), mask [N, T - 1]: logits row j predicts a response token)."""
    seqs = [p + r + ([tok.eos_id] if f else []) for p, r, f in zip(prompts, responses, finished, strict=True)]
    t = max(map(len, seqs))
    ids = torch.full((len(seqs), t), tok.pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), t - 1, dtype=torch.bool)
    for i, (s, p) in enumerate(zip(seqs, prompts, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, len(p) - 1 : len(s) - 1] = True
    return ids, mask


def policy_log_probs(policy: Qwen3, ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """[N, T - 1] log-probability of each next token under the policy at ``temperature`` (> 0).

    The trainer scores rollouts under the same tempered distribution they were sampled from, so the
    GRPO ratio is on-policy for the rollout temperature.
    """
    logits, _ = policy(ids)
    return grpo.token_log_probs(logits[:, :-1] / temperature, ids[:, 1:])


def evaluate(engine: RolloutEngine, problems: list[Problem], tok: CharTokenizer, gen: GenerationConfig,
             samples: int = 0, seed: int = 0) -> float:
    """Accuracy on ``problems``; speculation is lossless, so any spec mode works.

    ``samples=0``: greedy (temperature 0). Otherwise the mean over ``samples`` responses per problem at
    ``gen.temperature``, drawn with Philox keys fixed by ``seed``: every evaluation of a run uses the same
    keys, so two evaluations differ by the policy, not by the draw.
    """
    if samples:
        problems = [p for p in problems for _ in range(samples)]
        seeds = request_seeds(seed, -1, len(problems))  # step -1: never a training step's keys
    else:
        seeds, gen = [0] * len(problems), replace(gen, temperature=0.0)
    prompts = [tok.encode(p.prompt, bos=True) for p in problems]
    rewards = score(problems, engine.generate(prompts, seeds, gen), tok)
    return int((rewards == 1.0).sum()) / max(len(rewards), 1)


def validate(cfg: RunConfig, s: dict) -> dict:
    """``val_accuracy`` (see ``RunConfig.eval_samples``; greedy when it is 0) and ``val_greedy_accuracy`` of
    the current policy on the validation problems."""
    engine, val, tok, gen = s["engine"], s["val"], s["tok"], cfg.generation()
    greedy = evaluate(engine, val, tok, gen)
    sampled = evaluate(engine, val, tok, gen, cfg.eval_samples, cfg.seed) if cfg.eval_samples else greedy
    return {"val_accuracy": sampled, "val_greedy_accuracy": greedy}


def score(problems: list[Problem], rollouts: Rollouts, tok: CharTokenizer) -> torch.Tensor:
    return torch.tensor([reward(p, tok.decode(r), f) for p, r, f in
                         zip(problems, rollouts.response_ids, rollouts.finished, strict=True)])


def train_on_batch(
    policy: Qwen3, opt: torch.optim.Optimizer, ids: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor,
    cfg: RunConfig, ref: Qwen3 | None, behaviour: Qwen3 | None = None,
) -> dict:
    """Recompute old log-probs, then ``cfg.minibatches`` clipped GRPO steps over the batch.

    ``behaviour``: the policy version that generated the rollouts when it differs from ``policy`` (async
    pipeline, lag 1); the old log-probs, hence the importance ratio, are taken under it. None: ``policy``.
    """
    t0 = time.perf_counter()
    policy.eval()
    with torch.no_grad():
        old = policy_log_probs(policy if behaviour is None else behaviour, ids, cfg.temperature)
        ref_lp = policy_log_probs(ref, ids, cfg.temperature) if ref is not None and cfg.kl_coef > 0 else None
    t1 = time.perf_counter()
    policy.train()
    order = torch.randperm(ids.shape[0], generator=torch.Generator().manual_seed(cfg.seed))
    stats = []
    for chunk in order.chunk(cfg.minibatches):
        lp = policy_log_probs(policy, ids[chunk], cfg.temperature)
        out = grpo.grpo_loss(lp, old[chunk], adv[chunk], mask[chunk], cfg.clip_low, cfg.clip_high,
                             None if ref_lp is None else ref_lp[chunk], cfg.kl_coef)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()
        stats.append([out.loss.item(), out.clip_fraction.item(), out.mean_ratio.item(), out.kl.item(),
                      grad_norm.item()])
    policy.eval()
    mean = [sum(s[i] for s in stats) / len(stats) for i in range(5)]
    return {"loss": mean[0], "clip_fraction": mean[1], "ratio": mean[2], "kl": mean[3], "grad_norm": mean[4],
            "logprob_s": t1 - t0, "train_s": time.perf_counter() - t1}


# ----------------------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------------------

def _progress(iterable, enabled: bool, **kw):
    if not enabled:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, **kw)


def setup(cfg: RunConfig, log) -> dict:
    """Tokenizer, splits, warm-started policy and drafter, engine and optimizer (or restored from OUT)."""
    torch.manual_seed(cfg.seed)
    tok = CharTokenizer()
    train_set, val_set = make_splits(replace(cfg.task, seed=cfg.seed))
    policy = Qwen3(cfg.model)
    ckpt_path = os.path.join(cfg.out, "checkpoint.pt")
    ckpt = torch.load(ckpt_path, weights_only=False) if cfg.resume and os.path.exists(ckpt_path) else None
    timings = {}
    if ckpt is None:
        t0 = time.perf_counter()
        losses = supervised_warm_start(policy, train_set, tok, cfg.warm_start_steps, cfg.warm_start_batch,
                                       cfg.warm_start_lr, cfg.seed)
        timings["warm_start_s"] = time.perf_counter() - t0
        log({"event": "warm_start", "loss_first": losses[0] if losses else None,
             "loss_last": losses[-1] if losses else None, "seconds": timings["warm_start_s"]})
    else:
        policy.load_state_dict(ckpt["policy"])
    policy.eval()
    drafter = None
    if cfg.spec != "none":
        drafter = build_drafter(cfg.drafter, policy, cfg.seed)
        if ckpt is None:
            t0 = time.perf_counter()
            for p in policy.parameters():
                p.requires_grad_(False)
            losses = distill(drafter, policy, problem_batches(train_set, tok, cfg.warm_start_batch, cfg.seed + 1),
                             cfg.drafter_warm_steps, unroll=cfg.k - 1)
            for p in policy.parameters():
                p.requires_grad_(True)
            timings["drafter_warm_s"] = time.perf_counter() - t0
            log({"event": "drafter_warm_start", "loss_first": losses[0] if losses else None,
                 "loss_last": losses[-1] if losses else None, "seconds": timings["drafter_warm_s"]})
        else:
            drafter.trainable().load_state_dict(ckpt["drafter"])
    if cfg.spec == "tree":
        from .tree_engine import TreeRolloutEngine as engine_cls
    else:
        engine_cls = RolloutEngine
    engine = engine_cls(policy, drafter, tok.eos_id)
    opt = policy_optimizer(policy, cfg)
    if cfg.backend == "vllm":  # rollouts served by vLLM with our plugin (rl_loop/vllm_backend.py)
        from .vllm_backend import make_engine

        engine = make_engine(cfg, policy, drafter, tok)
    drafter_opt = None
    if drafter is not None:
        params = [p for p in drafter.trainable().parameters() if p.requires_grad]
        drafter_opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0, betas=(0.9, 0.98))
    ref = None
    if cfg.kl_coef > 0:
        ref = Qwen3(cfg.model)
        ref.load_state_dict(policy.state_dict() if ckpt is None else ckpt["ref"])
        ref.eval()
    state = {"step": 0, "metrics": [], "val_accuracy_start": None, "val_greedy_accuracy_start": None,
             "spec_stats": RolloutStats(k=cfg.k),
             "cmp": {"spec_tokens": 0, "spec_s": 0.0, "ar_tokens": 0, "ar_s": 0.0, "spec_step_s": 0.0,
                     "ar_step_s": 0.0}}
    if ckpt is not None:
        opt.load_state_dict(ckpt["opt"])
        if drafter_opt is not None and ckpt.get("drafter_opt") is not None:
            drafter_opt.load_state_dict(ckpt["drafter_opt"])
        state.update(step=ckpt["step"], val_accuracy_start=ckpt["val_accuracy_start"], cmp=ckpt["cmp"],
                     val_greedy_accuracy_start=ckpt.get("val_greedy_accuracy_start"))
        state["spec_stats"] = ckpt["spec_stats"]
        timings = ckpt.get("timings", {})
    return dict(tok=tok, train=train_set, val=val_set[: cfg.num_val], policy=policy, drafter=drafter,
                engine=engine, opt=opt, drafter_opt=drafter_opt, ref=ref, state=state, timings=timings)


def policy_optimizer(policy: Qwen3, cfg: RunConfig) -> torch.optim.AdamW:
    """AdamW over the policy in two parameter groups: every parameter but the output gain (``cfg.lr``), then
    the output gain, the final RMSNorm weight (``cfg.output_gain_lr``); :func:`set_learning_rates` sets both."""
    gain = policy.model.norm.weight
    rest = [p for p in policy.parameters() if p is not gain]
    groups = [{"params": rest, "lr": cfg.lr}, {"params": [gain], "lr": cfg.output_gain_lr}]
    return torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.99))


def set_learning_rates(opt: torch.optim.Optimizer, cfg: RunConfig, step: int) -> None:
    """Step ``step``'s rates for the two groups of :func:`policy_optimizer`: ``cfg.lr`` and
    ``cfg.output_gain_lr``, both linearly warmed up over ``cfg.lr_warmup_steps``."""
    warm = min(1.0, (step + 1) / max(cfg.lr_warmup_steps, 1))
    for group, lr in zip(opt.param_groups, (cfg.lr, cfg.output_gain_lr), strict=True):
        group["lr"] = lr * warm


def save_checkpoint(cfg: RunConfig, s: dict) -> None:
    st = s["state"]
    ckpt = {
        "step": st["step"], "policy": s["policy"].state_dict(), "opt": s["opt"].state_dict(),
        "drafter": None if s["drafter"] is None else s["drafter"].trainable().state_dict(),
        "drafter_opt": None if s["drafter_opt"] is None else s["drafter_opt"].state_dict(),
        "ref": None if s["ref"] is None else s["ref"].state_dict(),
        "val_accuracy_start": st["val_accuracy_start"], "val_greedy_accuracy_start": st["val_greedy_accuracy_start"],
        "cmp": st["cmp"], "spec_stats": st["spec_stats"],
        "timings": s["timings"], "config": asdict(cfg),
    }
    tmp = os.path.join(cfg.out, "checkpoint.pt.tmp")
    torch.save(ckpt, tmp)
    os.replace(tmp, os.path.join(cfg.out, "checkpoint.pt"))


def step_requests(cfg: RunConfig, s: dict, step: int) -> tuple[list[Problem], list[list[int]], list[int]]:
    """The step's problems (each repeated ``group_size`` times), their token prompts and Philox seeds."""
    tok = s["tok"]
    rng = random.Random(f"prompts/{cfg.seed}/{step}")
    problems = [p for p in rng.sample(s["train"], cfg.prompts_per_step) for _ in range(cfg.group_size)]
    prompts = [tok.encode(p.prompt, bos=True) for p in problems]
    return problems, prompts, request_seeds(cfg.seed, step, len(prompts))


def rollout_row(cfg: RunConfig, s: dict, step: int, rollouts: Rollouts, ar: RolloutStats | None) -> dict:
    """The generation part of a step's metrics row (``ar``: stats of the side-by-side AR rollouts)."""
    row: dict = {"step": step, "gen_s": rollouts.stats.time_s, "gen_tokens": rollouts.stats.tokens}
    if cfg.spec != "none":
        s["state"]["spec_stats"].merge(rollouts.stats)
        row.update(mean_accepted_length=rollouts.stats.mean_accepted_length,
                   acceptance_by_position=rollouts.stats.acceptance_by_position)
    if ar is not None:
        row.update(ar_gen_s=ar.time_s, ar_gen_tokens=ar.tokens)
    return row


def compare_step(cfg: RunConfig, step: int) -> bool:
    """Whether ``step`` also generates its requests autoregressively for the side-by-side timing."""
    return cfg.spec != "none" and cfg.compare_every > 0 and step % cfg.compare_every == 0


def learn(cfg: RunConfig, s: dict, step: int, problems: list[Problem], prompts: list[list[int]],
          rollouts: Rollouts, row: dict, behaviour: Qwen3 | None = None) -> None:
    """Score, GRPO-train on ``rollouts``, weight-sync the local engine and adapt the drafter; fills ``row``.

    ``behaviour``: see :func:`train_on_batch`.
    """
    tok, policy = s["tok"], s["policy"]
    rewards = score(problems, rollouts, tok)
    adv = grpo.group_advantages(rewards, cfg.group_size, scale=cfg.scale_advantages)
    keep = grpo.dynamic_sampling_mask(rewards, cfg.group_size) if cfg.dynamic_sampling else torch.ones_like(rewards, dtype=torch.bool)
    row.update(reward_mean=rewards.mean().item(), accuracy=(rewards == 1.0).float().mean().item(),
               kept_fraction=keep.float().mean().item(),
               response_length=sum(map(len, rollouts.response_ids)) / len(prompts),
               truncated=1.0 - sum(rollouts.finished) / len(prompts))
    train_stats = {"loss": 0.0, "clip_fraction": 0.0, "ratio": 1.0, "kl": 0.0, "grad_norm": 0.0, "logprob_s": 0.0,
                   "train_s": 0.0}
    if keep.any():
        idx = keep.nonzero().squeeze(1).tolist()
        ids, mask = build_batch([prompts[i] for i in idx], [rollouts.response_ids[i] for i in idx],
                                [rollouts.finished[i] for i in idx], tok)
        set_learning_rates(s["opt"], cfg, step)
        train_stats = train_on_batch(policy, s["opt"], ids, mask, adv[keep], cfg, s["ref"], behaviour)
    row.update(train_stats, output_gain=policy.model.norm.weight.mean().item())  # the policy's sharpness
    t0 = time.perf_counter()
    s["engine"].sync()  # weight sync: the engine and the drafter see the new policy
    if s["drafter"] is not None and cfg.drafter_adapt_steps > 0 and step % cfg.drafter_adapt_every == 0:
        ids, mask = build_batch(prompts, rollouts.response_ids, rollouts.finished, tok)
        for p in policy.parameters():
            p.requires_grad_(False)
        losses = distill(s["drafter"], policy, lambda: (ids, mask), cfg.drafter_adapt_steps,
                         optimizer=s["drafter_opt"], unroll=cfg.k - 1)
        for p in policy.parameters():
            p.requires_grad_(True)
        row["drafter_loss"] = losses[-1]
    row["sync_adapt_s"] = time.perf_counter() - t0


def account_step(s: dict, row: dict, rollouts: Rollouts, ar: RolloutStats | None) -> None:
    """Per-step time (``row["step_s"]``) and the running spec-vs-AR comparison totals in ``s["state"]``."""
    drafter_s = row["sync_adapt_s"]
    row["step_s"] = row["gen_s"] + row["logprob_s"] + row["train_s"] + drafter_s
    cmp = s["state"]["cmp"]
    cmp["adapt_s"] = cmp.get("adapt_s", 0.0) + drafter_s  # sync + adaptation, amortised over every step
    cmp["steps"] = cmp.get("steps", 0) + 1
    if ar is not None:
        cmp["spec_tokens"] += rollouts.stats.tokens
        cmp["spec_s"] += rollouts.stats.time_s
        cmp["ar_tokens"] += row["ar_gen_tokens"]
        cmp["ar_s"] += row["ar_gen_s"]
        cmp["compared"] = cmp.get("compared", 0) + 1
        # same training work on both sides; the speculative step also pays weight sync + adaptation
        cmp["spec_step_s"] += row["gen_s"] + row["logprob_s"] + row["train_s"]
        cmp["ar_step_s"] += row["ar_gen_s"] + row["logprob_s"] + row["train_s"]
        row["rollout_speedup"] = (rollouts.stats.tokens_per_s / max(ar.tokens_per_s, 1e-9))


def rl_step(cfg: RunConfig, s: dict, step: int) -> dict:
    """One sync GRPO step; returns its metrics row."""
    engine = s["engine"]
    problems, prompts, seeds = step_requests(cfg, s, step)
    rollouts = engine.generate(prompts, seeds, cfg.generation())
    ar = None
    if compare_step(cfg, step):  # the same requests, same policy snapshot, autoregressive: timing side by side
        ar = engine.generate(prompts, seeds, cfg.generation(spec="none")).stats
    row = rollout_row(cfg, s, step, rollouts, ar)
    learn(cfg, s, step, problems, prompts, rollouts, row)
    account_step(s, row, rollouts, ar)
    return row


def check_run_config(cfg: RunConfig) -> None:
    """Reject flag combinations no backend supports, with the flags named (before any work starts)."""
    if cfg.backend == "vllm":
        from .vllm_backend import check_config

        check_config(cfg)
    if cfg.spec == "tree":
        from .tree_engine import check_tree_config

        check_tree_config(cfg.drafter, cfg.pipeline)


def open_run(cfg: RunConfig):
    """Threads, OUT and ``metrics.jsonl`` (truncated unless resuming); returns the ``log(row)`` function."""
    torch.set_num_threads(cfg.num_threads)
    os.makedirs(cfg.out, exist_ok=True)
    metrics_path = os.path.join(cfg.out, "metrics.jsonl")
    if not cfg.resume and os.path.exists(metrics_path):
        os.remove(metrics_path)

    def log(row: dict) -> None:
        with open(metrics_path, "a") as f:
            f.write(json.dumps(row) + "\n")

    return log


def evaluate_start(cfg: RunConfig, s: dict, log) -> None:
    st = s["state"]
    if st["val_accuracy_start"] is None:
        v = validate(cfg, s)
        st["val_accuracy_start"], st["val_greedy_accuracy_start"] = v["val_accuracy"], v["val_greedy_accuracy"]
        log({"event": "eval", "step": 0, **v})


def run(cfg: RunConfig) -> dict:
    """Run the whole pipeline; returns the summary dict (also written to ``OUT/summary.json``)."""
    check_run_config(cfg)
    if cfg.pipeline == "async":
        from .async_pipeline import run_async

        return run_async(cfg)
    t_run = time.perf_counter()
    log = open_run(cfg)
    s = setup(cfg, log)
    st = s["state"]
    evaluate_start(cfg, s, log)
    for step in _progress(range(st["step"], cfg.steps), cfg.progress, desc="grpo", initial=st["step"],
                          total=cfg.steps):
        row = rl_step(cfg, s, step)
        if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
            row.update(validate(cfg, s))
        log(row)
        st["step"] = step + 1
        if cfg.checkpoint_every and st["step"] % cfg.checkpoint_every == 0:
            save_checkpoint(cfg, s)
    return finish_run(cfg, s, log, t_run)


def finish_run(cfg: RunConfig, s: dict, log, t_run: float, extra: dict | None = None) -> dict:
    """Final evaluation, checkpoint, exported policy, equivalence check, ``summary.json`` (+ ``extra``), plots."""
    st = s["state"]
    gen = cfg.generation()
    val_end = validate(cfg, s)
    log({"event": "eval", "step": cfg.steps, **val_end})
    save_checkpoint(cfg, s)
    save_pretrained(s["policy"], os.path.join(cfg.out, "policy"), s["tok"])

    eq = {"equivalence_pass": None, "equivalence_min_pvalue": None}
    if cfg.equivalence and s["drafter"] is not None:
        from .equivalence import EquivalenceConfig, check_equivalence

        eq_cfg = EquivalenceConfig(num_prompts=cfg.equivalence_prompts, samples_per_prompt=cfg.equivalence_samples,
                                   seed=cfg.seed, generation=gen)
        result = check_equivalence(s["engine"], s["val"], s["tok"], eq_cfg)
        with open(os.path.join(cfg.out, "equivalence.json"), "w") as f:
            json.dump(result, f, indent=1)
        eq = {"equivalence_pass": result["pass"], "equivalence_min_pvalue": result["min_pvalue"]}

    spec_stats: RolloutStats = st["spec_stats"]
    cmp = st["cmp"]
    summary = {
        "rollout_speedup": (cmp["spec_tokens"] / cmp["spec_s"]) / (cmp["ar_tokens"] / cmp["ar_s"])
        if cmp["spec_s"] > 0 and cmp["ar_s"] > 0 else None,
        "step_speedup": cmp["ar_step_s"] / (cmp["spec_step_s"] + cmp.get("compared", 0) * cmp.get("adapt_s", 0.0)
                                             / max(cmp.get("steps", 1), 1))
        if cmp["spec_step_s"] > 0 else None,
        "mean_accepted_length": spec_stats.mean_accepted_length if spec_stats.rounds else None,
        "acceptance_by_position": spec_stats.acceptance_by_position if spec_stats.rounds else None,
        **eq,
        "val_accuracy_start": st["val_accuracy_start"],
        "val_accuracy_end": val_end["val_accuracy"],
        "val_greedy_accuracy_start": st["val_greedy_accuracy_start"],
        "val_greedy_accuracy_end": val_end["val_greedy_accuracy"],
        "eval_samples": cfg.eval_samples,
        "k": cfg.k,
        "spec": cfg.spec, "drafter": cfg.drafter, "pipeline": cfg.pipeline, "backend": cfg.backend,
        "verify_backend": gen.backend, "steps": cfg.steps, "seed": cfg.seed,
        "spec_tokens_per_s": cmp["spec_tokens"] / cmp["spec_s"] if cmp["spec_s"] else None,
        "ar_tokens_per_s": cmp["ar_tokens"] / cmp["ar_s"] if cmp["ar_s"] else None,
        "time_breakdown_s": {
            "generation": spec_stats.time_s, "draft": spec_stats.draft_s, "target_forward": spec_stats.target_s,
            "verify": spec_stats.verify_s, "prefill": spec_stats.prefill_s,
        },
        **s["timings"],
        **(extra or {}),
        "wall_s": time.perf_counter() - t_run,
    }
    with open(os.path.join(cfg.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    if cfg.plots:
        from .plots import make_plots

        make_plots(cfg.out)
    return summary
