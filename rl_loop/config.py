"""Every knob of a run in one frozen dataclass (:class:`RunConfig`): defaults, choices, help and value checks
in one place; the CLI (``python -m rl_loop``) is generated from its fields."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from specdec_kernels.models import ModelConfig

from .step.engine import DECODE_PATHS, DEVICES
from .step.rollouts import VERIFY_METHODS, VERIFY_SPEC, GenerationConfig, TreeShape, resolve_verify_backend
from .task import TaskConfig

REQUIRED_SUMMARY_KEYS = (
    "rollout_speedup", "step_speedup", "mean_accepted_length", "acceptance_by_position", "equivalence_pass",
    "equivalence_min_pvalue", "val_accuracy_start", "val_accuracy_end", "k",
    "rollout_speedup_ci", "step_speedup_ci", "end_to_end_speedup", "break_even_steps", "ar_baseline",
    "rollout_temperature", "equivalence", "equivalence_control_rejected", "test_accuracy_start",
    "test_accuracy_end",
)
PIPELINES = ("sync", "async")
SPECS = ("none", "chain", "tree")
DRAFTERS = ("eagle3", "mtp", "draft_model")
BACKENDS = ("own", "vllm")


def default_policy() -> ModelConfig:
    """The default policy: deep and narrow (1.1M parameters). On the 2-core target machine the default
    run's verification forward of (k + 1) x 32 rows costs ~1.4x a one-token decode (per-op overhead, not
    matmul FLOPs, dominates; a 4-layer hidden-128 policy paid ~1.9x), and one step of the one-layer
    drafter head costs ~1/6 of a policy forward instead of ~1/3."""
    return ModelConfig(vocab_size=32, hidden_size=96, intermediate_size=192, num_hidden_layers=12,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=256)


def wide_policy() -> ModelConfig:
    """Shallow and wide (4 layers x hidden 256, 3.2M parameters, 13 MB): still cache-resident here (32 MB
    last-level cache), but fewer, larger matmuls per token than the default."""
    return ModelConfig(vocab_size=32, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=256)


def stream_policy() -> ModelConfig:
    """Weights well beyond the last-level cache (4 layers x hidden 1024, 50M parameters, 200 MB float32):
    at the rollout batch a decode streams every weight from memory, the GPU regime of large policies."""
    return ModelConfig(vocab_size=32, hidden_size=1024, intermediate_size=3072, num_hidden_layers=4,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=64, max_position_embeddings=256)


QWEN3_VOCAB_SIZE = 151936  # Qwen3's vocabulary (every size of the family)


def llm_policy() -> ModelConfig:
    """Qwen3-0.6B's proportions and vocabulary (0.6B parameters, 1.2 GB in bf16): V = 151936, hidden 1024,
    MLP 3072, 28 layers, 16 query / 8 key-value heads of 128, tied embeddings, RoPE theta 1e6. The task's
    tokens are the first ``task.VOCAB_SIZE`` rows; the other 151904 rows are random-initialised and the
    warm start teaches the policy never to produce them. A GPU policy: the CPU tests run
    :func:`llm_tiny_policy`."""
    return ModelConfig(vocab_size=QWEN3_VOCAB_SIZE, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=256,
                       rope_theta=1_000_000.0)


def llm_tiny_policy() -> ModelConfig:
    """:func:`llm_policy`'s vocabulary at a CPU test's width (hidden 64, 3 layers: EAGLE-3 needs three
    feature layers; 9.8M parameters, nearly all of them the 151936-row embedding): verification and the
    drafter run at the real V."""
    return replace(llm_policy(), hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=64)


POLICY_PRESETS = {"default": default_policy, "wide": wide_policy, "stream": stream_policy, "llm": llm_policy,
                  "llm-tiny": llm_tiny_policy}

# Task mixes (``--workload``): the problems and the response budget they need.
# default: add / mul / countdown at difficulty 1-2 (templated scratchpads; responses ~10-30 tokens).
# search: countdown written as search traces at difficulty 1-3 (``task.py``): free choices of which try
#   comes next, responses ~25-52 tokens; the mix whose draft acceptance is nearer RL reasoning's.
WORKLOADS = {
    "default": (TaskConfig(), 48),
    "search": (TaskConfig(families=("search",), difficulties=(1, 2, 3)), 56),
}


def with_workload(cfg: RunConfig, name: str) -> RunConfig:
    """``cfg`` on the task mix ``name`` (:data:`WORKLOADS`): its problems and ``max_new_tokens``, the split
    sizes and seed of ``cfg.task`` kept. ``"default"`` keeps ``cfg``'s own task and budget (a shortened
    configuration such as ``tiny_config`` keeps its difficulties)."""
    if name not in WORKLOADS:
        raise ValueError(f"workload must be one of {tuple(WORKLOADS)}, got {name!r}")
    if name == "default":
        return replace(cfg, workload=name)
    task, max_new = WORKLOADS[name]
    task = replace(cfg.task, families=task.families, difficulties=task.difficulties)
    return replace(cfg, workload=name, task=task, max_new_tokens=max_new)


MAX_SEED = 2**62  # run seeds are offset (seed + 1, seed + 7) and fed to int64 / numpy generators


def option(default, help: str, *, choices: tuple | None = None, check: tuple | None = None, flag: str | None = None):
    """A :class:`RunConfig` field that is also a command-line flag: its default, help, allowed values
    (``choices``) and value check (``check``: a predicate and what it demands, "must be ...") in one place.
    The CLI (``rl_loop/__main__.py``) is generated from these; the flag is ``--name-with-dashes`` unless
    ``flag`` names it (a bool that defaults to True is ``--no-name``)."""
    return field(default=default, metadata={"help": help, "choices": choices, "check": check, "flag": flag})


def flag_of(f) -> str:
    """The command-line flag of a :class:`RunConfig` field ``f`` (a ``dataclasses.Field``)."""
    if f.metadata.get("flag"):
        return f.metadata["flag"]
    name = f.name.replace("_", "-")
    return f"--no-{name}" if f.default is True else f"--{name}"


def _at_least(n):
    return (lambda v: v >= n, f"must be >= {n}")


@dataclass(frozen=True)
class RunConfig:
    """Every knob of a run. The fields made with :func:`option` are the command-line flags; the others
    (optimisation, warm starts, measurement sizes) are set in code, as ``tiny_config`` does."""

    out: str = option("runs/latest", "output directory")
    seed: int = option(0, "run seed (task splits, initialisation, every rollout's Philox keys)",
                       check=(lambda v: 0 <= v <= MAX_SEED, "must be an integer in [0, 2**62]"))
    # ~1 s a step on the 2-core target (rollouts, training, every 4th step's AR comparison): the default run
    # takes ~420 s of the 10-minute budget, ~230 s of it warm starts, evaluation and the equivalence check.
    steps: int = option(192, "GRPO steps", check=_at_least(0))
    pipeline: str = option("sync", "sync: generate -> log-probs -> train; async: generation overlapped with "
                           "training on a Ray actor (policy lag <= 1)", choices=PIPELINES)
    spec: str = option("chain", "speculation mode for rollouts", choices=SPECS)
    drafter: str = option("eagle3", "specdec_kernels.drafters head: EAGLE-3 (vLLM serves it as its eagle3 "
                          "speculator), MTP, or a one-layer draft model", choices=DRAFTERS)
    k: int = option(3, "draft tokens per verification round", check=(lambda v: v >= 1, "must be >= 1 (draft tokens "
                                                                     "per round)"))
    backend: str = option("own", "rollout engine: rl_loop's own, or vLLM with the specdec_kernels plugin",
                          choices=BACKENDS)
    verify_backend: str = option("default", "specdec_kernels backend for verification: default (native CPU if "
                                 "built, else reference), reference, cpu, triton, cuda")
    verify: str = option("token", "verification method: token (token level, chains and trees), block (block "
                         "verification of --spec chain) or traversal (traversal verification of --spec tree); "
                         "all lossless", choices=VERIFY_METHODS)
    # The policy's decode path for BOTH arms (``step/engine.py``); "auto": the fastest measured here (native).
    decode: str = option("auto", "the policy's decode path for both arms (auto: native fused layer step when built)",
                         choices=DECODE_PATHS)
    model: ModelConfig = field(default_factory=default_policy)
    task: TaskConfig = field(default_factory=TaskConfig)
    workload: str = option("default", "task mix: default (add / mul / countdown scratchpads), search (countdown "
                           "as search traces: less templated, lower draft acceptance)", choices=tuple(WORKLOADS))
    # rollouts
    prompts_per_step: int = option(16, "prompts per GRPO step", check=_at_least(1))
    group_size: int = option(8, "responses per prompt (a GRPO group)", check=_at_least(2))
    temperature: float = option(1.0, "rollout sampling temperature (the trainer's log-probs use the same "
                                "tempered policy)", check=(lambda v: math.isfinite(v) and v > 0,
                                                           "must be a finite number > 0 (RL rollouts sample)"))
    max_new_tokens: int = option(48, "response budget in tokens", check=_at_least(1))
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
    # The head's acceptance keeps rising with distillation (at k = 3 on the default policy, 300 / 600 / 900
    # steps gave 3.36 / 3.47 / 3.57 tokens per round with the previous head).
    drafter_warm_steps: int = 900
    drafter_warm_lr: float = 3e-3  # cosine-decayed over the warm start
    drafter_adapt_steps: int = 1  # online adaptation: gradient steps on the fresh rollouts (0 disables)
    drafter_adapt_every: int = 4  # ... every n RL steps (the policy drifts slowly; adaptation is not free)
    drafter_adapt_lr: float = 1e-3
    # measurement
    compare_every: int = option(4, "generate every n-th step's requests autoregressively too, side by side, "
                                "arm order alternated (0: never)", check=_at_least(0))
    num_val: int = 512
    # val_accuracy: pass@1 of the policy as it samples rollouts (rollout temperature), averaged over this many
    # responses per problem with fixed Philox keys; 0: greedy. val_greedy_accuracy is always reported too.
    eval_samples: int = option(4, "sampled responses per validation problem (0: greedy only)", check=_at_least(0))
    eval_every: int = option(0, "validate every n steps (0: at the start and the end only)", check=_at_least(0))
    # held-out test split (``run/session.py``), scored at the start and the end only: test_samples responses
    # per problem at the rollout temperature (pass@test_samples beside) and greedy
    num_test: int = 512
    test_samples: int = 4
    equivalence: bool = option(True, "the AR-vs-speculative equivalence check on the final policy")
    # 16 x 160 = 2560 samples per arm: two-sample power >= 0.9 at TV 0.1 per test (``run/equivalence.py``)
    equivalence_prompts: int = 16
    equivalence_samples: int = 160
    checkpoint_every: int = option(8, "write OUT/checkpoint.pt every n steps (0: never)", check=_at_least(0))
    resume: bool = option(False, "continue from OUT/checkpoint.pt")
    # where policy, drafter, KV cache and verification run (``step/engine.py``): cpu (float32) | cuda (bf16)
    device: str = option("cpu", "where policy, drafter, KV cache and verification run: cpu (float32, native CPU "
                         "kernels) or cuda (bf16 weights, verify_chain backend auto, CUDA graphs for both arms)",
                         choices=DEVICES)
    num_threads: int = option(2, "torch intra-op threads (both arms)", check=_at_least(1), flag="--threads")
    # Ray rollout workers (pipelines/ray_rollout.py): sync with 1 generates in-process; async always runs on Ray
    rollout_workers: int = option(1, "rollout workers as Ray actors, groups split across them (sync: 1 = "
                                  "in-process); RAY_ADDRESS attaches to an existing cluster", check=_at_least(1))
    dump_rollouts: bool = option(False, "write OUT/rollouts.jsonl: every step's request seeds and response token ids")
    # sampling masks (``step/rollouts.RolloutMask``): record per rollout token the ids the target kept;
    # mask_logprobs (which sets record_mask) takes GRPO's log-probabilities over those kept sets
    record_mask: bool = option(False, "record per rollout token the ids the sampler kept (its sampling mask)")
    mask_logprobs: bool = option(False, "GRPO log-probabilities over the recorded kept sets (implies --record-mask)")
    # the target's truncation in both arms (verify_chain / verify_tree top_k, top_p): 0 / 1.0 keep every token
    top_k: int = option(0, "keep the k most likely tokens when sampling, in both arms (0: all; the kept sets are "
                        "what --record-mask records)", check=_at_least(0))
    top_p: float = option(1.0, "keep the smallest set of most likely tokens holding this probability, in both "
                          "arms (1.0: all)", check=(lambda v: 0.0 < v <= 1.0, "must be in (0, 1]"))
    plots: bool = option(True, "plots of the run in OUT/")
    progress: bool = option(True, "a progress bar over the steps")

    def __post_init__(self) -> None:
        for f in fields(self):
            value, choices, check = getattr(self, f.name), f.metadata.get("choices"), f.metadata.get("check")
            if choices is not None and value not in choices:
                raise ValueError(f"{flag_of(f)} must be one of {', '.join(choices)}, got {value!r}")
            if check is not None and not check[0](value):
                raise ValueError(f"{flag_of(f)} {check[1]}, got {value}")
        needs = VERIFY_SPEC.get(self.verify)
        if needs is not None and self.spec != needs:
            other = {"chain": "block", "tree": "traversal"}.get(self.spec)
            hint = f"; --spec {self.spec} takes --verify token or {other}" if other else ""
            raise ValueError(f"--verify {self.verify} verifies draft {'chains' if needs == 'chain' else 'trees'}: "
                             f"it needs --spec {needs}, got --spec {self.spec}{hint}")
        if (self.top_k > 0 or self.top_p < 1.0) and self.backend != "own":
            raise ValueError("--top-k / --top-p need --backend own: rl_loop's vLLM backend does not pass them on")
        if (self.record_mask or self.mask_logprobs) and self.backend != "own":
            raise ValueError("--record-mask / --mask-logprobs need --backend own: the vLLM CPU engine (V1 model "
                             "runner) cannot return sampling masks (vLLM's return_sampling_mask needs Model Runner V2)")
        if self.mask_logprobs and not self.record_mask:
            object.__setattr__(self, "record_mask", True)  # the log-probabilities need the recorded sets

    def generation(self, spec: str | None = None, temperature: float | None = None) -> GenerationConfig:
        return GenerationConfig(
            max_new_tokens=self.max_new_tokens, spec=self.spec if spec is None else spec, k=self.k,
            temperature=self.temperature if temperature is None else temperature, max_batch=self.max_batch,
            backend=resolve_verify_backend(self.verify_backend, self.device), tree=TreeShape.for_k(self.k), verify=self.verify,
            record_mask=self.record_mask, top_k=self.top_k, top_p=self.top_p,
        )


def tiny_config(**overrides) -> RunConfig:
    """A seconds-long configuration for tests and smoke runs (3 layers: EAGLE-3 needs three feature layers)."""
    base = RunConfig(
        steps=1, model=replace(default_policy(), num_hidden_layers=3, intermediate_size=128),
        task=TaskConfig(num_train=256, num_val=16, difficulties=(1,)), prompts_per_step=2, group_size=4,
        max_new_tokens=24, warm_start_steps=20, drafter_warm_steps=5, num_val=8, num_test=8, compare_every=1,
        equivalence_prompts=2, equivalence_samples=8, checkpoint_every=1, plots=False, progress=False,
    )
    return replace(base, **overrides)
