"""Every knob of a run in one frozen dataclass (:class:`RunConfig`); the CLI maps its flags onto it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from specdec_kernels.models import ModelConfig

from .step.decode import DECODE_PATHS
from .step.device import DEVICES
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
    # verification method: token (either spec) | block (--spec chain) | traversal (--spec tree)
    verify: str = "token"
    # The policy's decode path for BOTH arms (``decode.py``); "auto": the fastest measured here (native).
    decode: str = "auto"
    model: ModelConfig = field(default_factory=default_policy)
    task: TaskConfig = field(default_factory=TaskConfig)
    workload: str = "default"  # the task mix's name (``with_workload``); ``task`` holds its problems
    # rollouts
    prompts_per_step: int = 16
    group_size: int = 8
    temperature: float = 1.0  # rollout temperature; the trainer's log-probs use the same tempered policy
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
    # The head's acceptance keeps rising with distillation (at k = 3 on the default policy, 300 / 600 / 900
    # steps gave 3.36 / 3.47 / 3.57 tokens per round with the previous head).
    drafter_warm_steps: int = 900
    drafter_warm_lr: float = 3e-3  # cosine-decayed over the warm start
    drafter_adapt_steps: int = 1  # online adaptation: gradient steps on the fresh rollouts (0 disables)
    drafter_adapt_every: int = 4  # ... every n RL steps (the policy drifts slowly; adaptation is not free)
    drafter_adapt_lr: float = 1e-3
    # measurement
    compare_every: int = 4  # AR rollouts of the same requests side by side every n steps (0: never)
    num_val: int = 512
    # val_accuracy: pass@1 of the policy as it samples rollouts (rollout temperature), averaged over this many
    # responses per problem with fixed Philox keys; 0: greedy. val_greedy_accuracy is always reported too.
    eval_samples: int = 4
    eval_every: int = 0  # 0: only at start and end
    # held-out test split (``heldout.py``), scored at the start and the end only: test_samples responses per
    # problem at the rollout temperature (pass@test_samples beside) and greedy
    num_test: int = 512
    test_samples: int = 4
    equivalence: bool = True
    # 16 x 160 = 2560 samples per arm: two-sample power >= 0.9 at TV 0.1 per test (``equivalence.py``)
    equivalence_prompts: int = 16
    equivalence_samples: int = 160
    checkpoint_every: int = 8
    resume: bool = False
    # where policy, drafter, KV cache and verification run (``device.py``): cpu (float32) | cuda (bf16)
    device: str = "cpu"
    num_threads: int = 2  # torch intra-op threads (both cores of the 2-core target machine)
    # Ray rollout workers (ray_rollout.py): sync with 1 generates in-process; async always runs on Ray
    rollout_workers: int = 1
    dump_rollouts: bool = False  # OUT/rollouts.jsonl: every step's seeds and response token ids
    # sampling masks (``rollouts.RolloutMask``): record per rollout token the ids the target kept; mask_logprobs
    # (implies record_mask) takes GRPO's log-probabilities over those kept sets (``logprobs.kept_batch``)
    record_mask: bool = False
    mask_logprobs: bool = False
    # the target's truncation in both arms (verify_chain / verify_tree top_k, top_p): 0 / 1.0 keep every token
    top_k: int = 0
    top_p: float = 1.0
    plots: bool = True
    progress: bool = True

    def __post_init__(self) -> None:
        choices = {"pipeline": PIPELINES, "spec": SPECS, "drafter": DRAFTERS, "backend": BACKENDS,
                   "decode": DECODE_PATHS, "verify": VERIFY_METHODS, "workload": tuple(WORKLOADS),
                   "device": DEVICES}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        needs = VERIFY_SPEC.get(self.verify)
        if needs is not None and self.spec != needs:
            other = {"chain": "block", "tree": "traversal"}.get(self.spec)
            hint = f"; --spec {self.spec} takes --verify token or {other}" if other else ""
            raise ValueError(f"--verify {self.verify} verifies draft {'chains' if needs == 'chain' else 'trees'}: "
                             f"it needs --spec {needs}, got --spec {self.spec}{hint}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 for RL rollouts, got {self.temperature}")
        if self.steps < 0 or self.k < 1 or self.group_size < 2 or self.prompts_per_step < 1:
            raise ValueError("steps >= 0, k >= 1, group_size >= 2 and prompts_per_step >= 1 are required")
        if self.rollout_workers < 1:
            raise ValueError(f"--rollout-workers must be >= 1, got {self.rollout_workers}")
        if self.top_k < 0 or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"--top-k must be >= 0 and --top-p in (0, 1], got {self.top_k} and {self.top_p}")
        if (self.top_k > 0 or self.top_p < 1.0) and self.backend != "own":
            raise ValueError("--top-k / --top-p need --backend own: rl_loop's vLLM backend does not pass them on")
        if (self.record_mask or self.mask_logprobs) and self.backend != "own":
            raise ValueError("--record-mask / --mask-logprobs need --backend own: the vLLM CPU engine (V1 model "
                             "runner) cannot return sampling masks (vLLM's return_sampling_mask needs Model Runner V2)")
        if self.eval_samples < 0:
            raise ValueError(f"eval_samples must be >= 0, got {self.eval_samples}")

    def generation(self, spec: str | None = None, temperature: float | None = None) -> GenerationConfig:
        return GenerationConfig(
            max_new_tokens=self.max_new_tokens, spec=self.spec if spec is None else spec, k=self.k,
            temperature=self.temperature if temperature is None else temperature, max_batch=self.max_batch,
            backend=resolve_verify_backend(self.verify_backend, self.device), tree=TreeShape.for_k(self.k), verify=self.verify,
            record_mask=self.record_mask or self.mask_logprobs, top_k=self.top_k, top_p=self.top_p,
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
