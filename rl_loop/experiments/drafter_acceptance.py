"""Mean accepted length of EAGLE-3 heads on a math task: domain vs generic initialisation, and online
adaptation after the policy drifts.

Setup (everything built locally, seeded):
- Tokens: the math task's character vocabulary (``rl_loop.task``) occupies ids < 32; ids 32..58 are the letters
  and space of a synthetic *generic* corpus (sentences of random words with a few numbers), V = 64.
- Target: a tiny Qwen3 trained (next-token LM) on a mix of math text and generic text.
- Heads: EAGLE-3 heads of identical shape, each with a draft vocabulary picked by token frequency on its
  init corpus, trained by ``DrafterTrainer`` for the same number of steps on the target's features over
  (a) math text (domain) or (b) generic text. A full-vocabulary variant isolates the weights' effect.
- Metric: tokens per verification round (accepted drafts + 1) in a real draft/verify loop through
  ``specdec_kernels.verify_chain`` on held-out math prompts, greedy and temperature 1 (stochastic drafts
  with q rows), k = 1..7.
- Drift: the target is fine-tuned on a shifted task mix; the domain head is evaluated stale, after weight
  sync only, and after online adaptation (DrafterTrainer.step on the drifted policy's own rollouts,
  consuming the features/logits of its forward through the detach boundary).

``python -m rl_loop.experiments.drafter_acceptance --help``; writes JSON to ``results/benchmarks/``. It lives in rl_loop
because it reads the loop's task (the kernel benchmarks never import rl_loop).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

from specdec_kernels import verify_chain
from specdec_kernels.drafters.eagle3 import Eagle3Config, Eagle3Drafter, Eagle3Head, default_feature_layers
from specdec_kernels.drafters.features import capture_target_features
from specdec_kernels.drafters.training import DrafterTrainer, TrainConfig, build_draft_vocab
from specdec_kernels.models.tiny_qwen3 import tiny_qwen3

from .. import task as math_task
from ..run.provenance import provenance
from ..run.usage import OneLineParser

V = 64
PAD, BOS, EOS = 0, 1, 2
LETTERS = 32  # ids 32..57 letters, 58 space
SPACE = 58

# ---------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------


class MathTask:
    """Math problems of ``rl_loop.task`` as token ids."""

    source = "rl_loop.task"

    def __init__(self) -> None:
        self.tok = math_task.CharTokenizer()

    def problems(self, rng: random.Random, families: tuple[str, ...], n: int, difficulties=(1, 2)):
        out = []
        for _ in range(n):
            p = math_task.make_problem(rng, rng.choice(families), rng.choice(difficulties))
            out.append((p.prompt, p.solution))
        return out

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text)

    def families(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(initial families, drifted families)."""
        return ("add", "mul"), ("countdown", "mul")


def math_sequences(task: MathTask, problems) -> list[tuple[list[int], list[int]]]:
    return [([BOS, *task.encode(p)], [*task.encode(s), EOS]) for p, s in problems]


def generic_sequences(task: MathTask, rng: random.Random, n: int, length: int = 40) -> list[list[int]]:
    """Sentences of words from a fixed random lexicon (Zipf-like) with occasional numbers and inline sums
    (``"12+7=19"``, as generic text has some arithmetic), as token ids."""
    lex_rng = random.Random(1234)
    lexicon = [[LETTERS + lex_rng.randrange(26) for _ in range(lex_rng.randint(2, 6))] for _ in range(60)]
    weights = [1.0 / (i + 1) for i in range(len(lexicon))]
    out = []
    for _ in range(n):
        seq = [BOS]
        while len(seq) < length:
            r = rng.random()
            if r < 0.08:
                seq += task.encode(str(rng.randrange(1, 1000)))
            elif r < 0.14:
                a, b = rng.randrange(1, 100), rng.randrange(1, 100)
                seq += task.encode(f"{a}+{b}={a + b}")
            else:
                seq += rng.choices(lexicon, weights)[0]
            seq.append(SPACE)
        out.append(seq[:length])
    return out


def pad(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), n), PAD, dtype=torch.int64)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
    return ids, torch.tensor([len(s) for s in seqs])


# ---------------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------------


def train_lm(model, seqs: list[list[int]], steps: int, lr: float, batch: int, seed: int) -> float:
    """Next-token LM training of the target on ``seqs`` (padding masked)."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        ids, lengths = pad(rng.sample(seqs, batch))
        mask = (torch.arange(ids.shape[1])[None] < lengths[:, None]).long()
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        tgt = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return float(loss.detach())


def make_head(target, vocab: torch.Tensor, seed: int) -> Eagle3Head:
    torch.manual_seed(seed)
    cfg = Eagle3Config(V, vocab.numel(), 64, 64, 128, 2, 1, 32,
                       default_feature_layers(target.config.num_hidden_layers))
    head = Eagle3Head(cfg)
    head.set_draft_vocab(vocab)
    return head


def fit_head(head, target, seqs: list[list[int]], steps: int, batch: int, seed: int) -> DrafterTrainer:
    rng = random.Random(seed)
    trainer = DrafterTrainer(head, TrainConfig(lr=3e-3, ttt_steps=3))
    trainer.sync(target, 0)
    batches = [pad(rng.sample(seqs, batch)) for _ in range(steps)]
    trainer.fit_offline(target, batches)
    return trainer


# ---------------------------------------------------------------------------------------------------
# Speculative decoding loop
# ---------------------------------------------------------------------------------------------------


@torch.no_grad()
def tokens_per_round(target, head, prompts: list[list[int]], k: int, temperature: float, max_new: int,
                     seed: int) -> tuple[float, float, float]:
    """Mean (accepted drafts + 1) per verification round, over rounds that start before EOS; plus the
    realised and the expected (sum_x min(p, q)) acceptance rate of the first draft of a round."""
    layers = head.cfg.feature_layers
    b = len(prompts)
    ids, lengths = pad(prompts)
    mask = (torch.arange(ids.shape[1])[None] < lengths[:, None]).long()
    cap = capture_target_features(target, ids, layers, attention_mask=mask)
    last = cap.logits[torch.arange(b), lengths - 1]
    seeds = torch.arange(b, dtype=torch.int64) + 1000 * seed
    temp = torch.full((b,), float(temperature))
    first = verify_chain(last, torch.zeros(0, dtype=torch.int64), torch.zeros(b + 1, dtype=torch.int64),
                         temperature=temp, seed=seeds, position=lengths, backend="reference")
    nxt = first.output_token_ids[:, 0].long()
    drafter = Eagle3Drafter(head)
    drafter.prefill(ids, lengths, nxt, cap.eagle3_features)
    seqs = [prompts[i] + [int(nxt[i])] for i in range(b)]
    done = [int(nxt[i]) == EOS for i in range(b)]
    stats, realised, expected = [], [], []
    while not all(done) and min(len(s) - len(p) for s, p in zip(seqs, prompts, strict=True)) < max_new:
        pos = drafter.num_tokens
        prop = drafter.propose(k, temp if temperature > 0 else None, seeds, pos)
        full, full_len = pad([s + prop.token_ids[i].tolist() for i, s in enumerate(seqs)])
        m = (torch.arange(full.shape[1])[None] < full_len[:, None]).long()
        cap = capture_target_features(target, full, layers, attention_mask=m)
        rows = (torch.tensor([len(s) for s in seqs])[:, None] - 1 + torch.arange(k + 1)[None])
        logits = cap.logits[torch.arange(b)[:, None], rows].reshape(b * (k + 1), V)
        feats = cap.eagle3_features[torch.arange(b)[:, None], rows]
        tok, cu, probs = prop.flat()
        res = verify_chain(logits, tok, cu, draft_probs=probs, temperature=temp, seed=seeds, position=pos,
                           backend="reference")
        drafter.commit(res.num_accepted, res.output_token_ids, feats)
        if temperature > 0:
            p0 = torch.softmax(logits.view(b, k + 1, V)[:, 0].float() / temperature, -1)
            alpha = torch.minimum(p0, prop.probs[:, 0]).sum(-1)
        else:
            top = logits.view(b, k + 1, V)[:, 0].argmax(-1)
            alpha = (top == prop.token_ids[:, 0]).float()
        for i in range(b):
            n = int(res.num_accepted[i])
            if not done[i] and len(seqs[i]) - len(prompts[i]) < max_new:
                stats.append(n + 1)
                realised.append(float(n >= 1))
                expected.append(float(alpha[i]))
            new = res.output_token_ids[i, : n + 1].tolist()
            seqs[i] += new
            done[i] = done[i] or EOS in new
    m = max(len(stats), 1)
    return sum(stats) / m, sum(realised) / m, sum(expected) / m


@torch.no_grad()
def sample_rollouts(policy, prompts: list[list[int]], max_new: int, seed: int) -> list[list[int]]:
    """Temperature-1 samples of ``policy`` (plain batched autoregressive loop), stopping at EOS."""
    g = torch.Generator().manual_seed(seed)
    seqs = [list(p) for p in prompts]
    done = [False] * len(seqs)
    for _ in range(max_new):
        ids, lengths = pad(seqs)
        mask = (torch.arange(ids.shape[1])[None] < lengths[:, None]).long()
        logits = policy(input_ids=ids, attention_mask=mask).logits[torch.arange(len(seqs)), lengths - 1]
        nxt = torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=g)[:, 0].tolist()
        for i, t in enumerate(nxt):
            if not done[i]:
                seqs[i].append(t)
                done[i] = t == EOS
        if all(done):
            break
    return seqs


def sweep(target, head, prompts, temperature: float, max_new: int, ks=range(1, 8),
          diagnostics: list | None = None) -> list[float]:
    """Tokens per round for k = 1..7 (same seeds for every k: common random numbers across k)."""
    out = []
    for k in ks:
        tpr, real, exp = tokens_per_round(target, head, prompts, k, temperature, max_new, seed=0)
        out.append(round(tpr, 3))
        if diagnostics is not None:
            diagnostics.append({"k": k, "T": temperature, "first_draft_acceptance_realised": round(real, 4),
                                "first_draft_acceptance_expected": round(exp, 4)})
    return out


# ---------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    ap = OneLineParser(prog="python -m rl_loop.experiments.drafter_acceptance", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target-steps", type=int, default=600)
    ap.add_argument("--head-steps", type=int, default=300)
    ap.add_argument("--adapt-steps", type=int, default=60)
    ap.add_argument("--drift-steps", type=int, default=300)
    ap.add_argument("--draft-vocab", type=int, default=32)
    ap.add_argument("--eval-prompts", type=int, default=32)
    ap.add_argument("--max-new", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="results/benchmarks/drafter_acceptance.json")
    args = ap.parse_args(argv)
    command = " ".join(["python -m rl_loop.experiments.drafter_acceptance", *(sys.argv[1:] if argv is None else argv)])
    torch.set_num_threads(args.threads)
    t0 = time.time()
    rng = random.Random(0)
    task = MathTask()
    fam0, fam1 = task.families()
    math_train = math_sequences(task, task.problems(rng, fam0, 3000))
    math_eval = math_sequences(task, task.problems(random.Random(99), fam0, args.eval_prompts))
    generic = generic_sequences(task, rng, 3000)
    target = tiny_qwen3(vocab_size=V, hidden_size=64, num_layers=4, num_heads=2, num_kv_heads=1, head_dim=32,
                        intermediate_size=192, seed=0, transformers=True)
    lm_seqs = [p + s for p, s in math_train] + generic
    target_loss = train_lm(target, lm_seqs, args.target_steps, 3e-3, 32, seed=1)
    print(f"target trained: loss {target_loss:.3f} ({time.time() - t0:.0f}s, task source: {task.source})")

    domain_corpus = [p + s for p, s in math_train]
    eval_prompts = [p for p, _ in math_eval]
    results: dict = {"task_source": task.source, "ks": list(range(1, 8)), "metric": "tokens per round"}
    heads = {}
    for name, corpus in (("domain", domain_corpus), ("generic", generic)):
        for vocab_kind in ("reduced", "full"):
            vd = args.draft_vocab if vocab_kind == "reduced" else V
            vocab = build_draft_vocab([torch.tensor(s) for s in corpus], vd, V)
            head = make_head(target, vocab, seed=2)
            fit_head(head, target, corpus, args.head_steps, 16, seed=3)
            heads[(name, vocab_kind)] = head
            for temperature in (0.0, 1.0):
                key = f"{name}_{vocab_kind}_T{temperature:g}"
                diag = results.setdefault("diagnostics", {}).setdefault(key, [])
                results[key] = sweep(target, head, eval_prompts, temperature, args.max_new, diagnostics=diag)
                print(f"{key:24s} {results[key]}  ({time.time() - t0:.0f}s)")

    # Policy drift: fine-tune the target on the shifted task mix, then compare the domain head
    # stale / synced / adapted online on the drifted task.
    drift_train = math_sequences(task, task.problems(rng, fam1, 3000, difficulties=(2, 3)))
    drift_eval = [p for p, _ in math_sequences(task, task.problems(random.Random(98), fam1, args.eval_prompts,
                                                                    difficulties=(2, 3)))]
    stale = heads[("domain", "reduced")]
    results["before_drift_on_drifted_task_T0"] = sweep(target, stale, drift_eval, 0.0, args.max_new)
    policy = target
    train_lm(policy, [p + s for p, s in drift_train] + generic[:500], args.drift_steps, 2e-3, 32, seed=5)
    results["stale_T0"] = sweep(policy, stale, drift_eval, 0.0, args.max_new)
    synced = make_head(policy, stale.draft_to_target(), seed=2)
    synced.load_state_dict(stale.state_dict())
    trainer = DrafterTrainer(synced, TrainConfig(lr=3e-3))
    trainer.sync(policy, policy_version=1)
    results["synced_T0"] = sweep(policy, synced, drift_eval, 0.0, args.max_new)
    # Online adaptation: the policy's own rollouts on drifted prompts; the features and logits come from
    # the policy forward the RL step runs anyway (here recomputed once), consumed through detach().
    roll_rng = random.Random(7)
    prompts = [p for p, _ in drift_train]
    for _ in range(args.adapt_steps):
        ids, lengths = pad(sample_rollouts(policy, roll_rng.sample(prompts, 16), args.max_new, seed=_))
        mask = (torch.arange(ids.shape[1])[None] < lengths[:, None]).long()
        cap = capture_target_features(policy, ids, synced.cfg.feature_layers, attention_mask=mask)
        trainer.step(ids, cap.eagle3_features, cap.logits, lengths)
    results["adapted_T0"] = sweep(policy, synced, drift_eval, 0.0, args.max_new)
    results["adapted_T1"] = sweep(policy, synced, drift_eval, 1.0, args.max_new)
    results["stale_T1"] = sweep(policy, stale, drift_eval, 1.0, args.max_new)
    for key in ("before_drift_on_drifted_task_T0", "stale_T0", "synced_T0", "adapted_T0", "stale_T1",
                "adapted_T1"):
        print(f"{key:32s} {results[key]}")
    results["args"] = vars(args)
    results["seconds"] = round(time.time() - t0, 1)
    results["provenance"] = provenance(command)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out} ({results['seconds']}s)")


if __name__ == "__main__":
    main()
