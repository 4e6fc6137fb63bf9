"""Audit target ``transformers-assisted``: Hugging Face transformers' assisted generation end to end.

``target_model.generate(prompt, assistant_model=assistant, do_sample=True, ...)`` with the stock
``AssistedCandidateGenerator``: the assistant samples its candidates (it runs ``generate`` with the target's
generation config, so ``do_sample=True`` and the target's logits processors) and returns the processed scores
it sampled from as ``candidate_logits``; the target scores the candidates in one forward pass, applies its
logits processors and ``_speculative_sampling`` accepts a prefix. Everything runs as transformers ships it:
KV caches and their cropping, the candidate count (``num_assistant_tokens``, capped by ``max_new_tokens``),
the assistant's confidence stopping (``assistant_confidence_threshold``, default 0.4).

The models are tiny Llamas built here from seeded random weights (no download), sharing one vocabulary of
:data:`VOCAB` tokens: the target, a *close* assistant (the target with its output head perturbed: most
candidates accepted) and a *far* one (independent weights: most rejected). Each case generates
:data:`NEW_TOKENS` tokens after :data:`PROMPT` many times, each generation seeded by ``torch.manual_seed``, and
tests the law of the whole generated sequence against the law of the target's own ``generate(do_sample=True)``:
the product over positions of softmax of the target's logits for that prefix after transformers' logits
processors (temperature, top-k, top-p), enumerated over all ``VOCAB ** NEW_TOKENS`` sequences.

Families: ``sequence`` (the law cases, one of them plain ``generate(do_sample=True)`` without an assistant:
the check of the law itself), ``greedy`` (``do_sample=False`` assisted generation emits the target's greedy
tokens) and ``mutants`` (negative controls that must be rejected: a candidate generator returning a ``q`` other
than the one it sampled from, the transformers issue #47932 class; one proposing the assistant's argmax while
returning its scores as ``q``; the suite's planted verification bugs in ``_speculative_sampling``'s place).
Every patch is scoped: an instance attribute or module global, restored on exit.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..exactness import goodness_of_fit as gof
from ..exactness.chain_law import LawCheck
from ..exactness.chain_mutants import mutant_verifier
from ..exactness.markov_models import SamplingConfig, all_sequences, encode_sequences
from . import transformers_target
from .audit_target import AuditTarget
from .families import (
    CAUGHT,
    ERROR,
    FAIL,
    MISSED,
    PASS,
    AuditOptions,
    Outcome,
    _one_line,
    _worst_cells,
    design_power,
)

__all__ = ["AssistedCase", "CASES", "CONTROLS", "GREEDY_CASES", "target", "tiny_models", "sequence_law",
           "generate_sequences", "check_case"]

VOCAB = 6
PROMPT = (3, 1, 4)
NEW_TOKENS = 3
HEAD_SCALE = 12.0  # the output head's weights times this: peaked rows (a few likely tokens per prefix)
CLOSE_NOISE = 0.08  # the close assistant's output head: the target's (scaled) plus normal noise of this std


@dataclass(frozen=True)
class AssistedCase:
    """One law case: ``cfg`` (temperature, top-k, top-p of ``generate``), the ``assistant`` ("close", "far",
    or None: plain ``generate`` of the target), the assistant's ``confidence`` threshold (None: transformers'
    default), and for a negative control the ``candidates`` generator ("sampled": transformers' own; "raw-logits",
    "argmax") or a planted ``bug`` of the suite run in ``_speculative_sampling``'s place. ``seed``: generation i
    is seeded with ``seed * 1_000_000 + i``."""

    name: str
    cfg: SamplingConfig
    assistant: str | None
    seed: int
    confidence: float | None = None
    candidates: str = "sampled"
    bug: str | None = None

    @property
    def vocab_size(self) -> int:  # the cell labels of families._worst_cells read these two
        return VOCAB

    @property
    def length(self) -> int:
        return NEW_TOKENS

    def label(self) -> str:
        what = "target alone, generate(do_sample=True)" if self.assistant is None else f"{self.assistant} assistant"
        if self.confidence is not None:
            what += f", confidence threshold {self.confidence:g}"
        if self.candidates != "sampled":
            what += f", {self.candidates} candidates"
        if self.bug:
            what += f", {self.bug} in _speculative_sampling's place"
        return f"{self.cfg.label()}, {what}, V={VOCAB}, {NEW_TOKENS} new tokens"


T1, T07K3, T13P08 = SamplingConfig(1.0), SamplingConfig(0.7, top_k=3), SamplingConfig(1.3, top_p=0.8)
CASES = (
    AssistedCase("hf-plain-T1", T1, None, 1),
    AssistedCase("hf-assisted-close-T1", T1, "close", 2),
    AssistedCase("hf-assisted-close-T0.7-k3", T07K3, "close", 3),
    AssistedCase("hf-assisted-close-T1.3-p0.8", T13P08, "close", 4),
    AssistedCase("hf-assisted-far-T1", T1, "far", 5),
    AssistedCase("hf-assisted-close-T1-conf0", T1, "close", 6, confidence=0.0),
)
"""The law cases (family ``sequence``)."""
CONTROLS = (
    AssistedCase("candidates-raw-logits", T07K3, "close", 11, candidates="raw-logits"),
    AssistedCase("candidates-argmax", T1, "close", 12, candidates="argmax"),
    AssistedCase("ratio_inverted", T1, "close", 13, bug="ratio_inverted"),
    AssistedCase("bonus_wrong_row", T1, "close", 14, confidence=0.0, bug="bonus_wrong_row"),
)
"""The negative controls (family ``mutants``): each must be rejected."""
GREEDY_CASES = ("assisted-greedy-close", "assisted-greedy-far")
GREEDY_PROMPTS, GREEDY_TOKENS = 12, 6


# ----------------------------------------------------------------------------------------------------
# Tiny models
# ----------------------------------------------------------------------------------------------------

def _tiny_llama(seed: int):
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                         bos_token_id=None, eos_token_id=None, pad_token_id=0, tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(HEAD_SCALE)
    model.generation_config = GenerationConfig(pad_token_id=0, bos_token_id=None, eos_token_id=None)
    return model


@functools.cache
def tiny_models() -> dict[str, object]:
    """``{"target", "close", "far"}``: tiny Llamas sharing one vocabulary (no end-of-sequence token, so every
    generation holds exactly the tokens asked for), built from fixed seeds."""
    target = _tiny_llama(1)
    close = copy.deepcopy(target)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        close.lm_head.weight.add_(torch.randn(close.lm_head.weight.shape, generator=g) * CLOSE_NOISE)
    return {"target": target, "close": close, "far": _tiny_llama(2)}


def _generation_config(cfg: SamplingConfig, do_sample: bool = True, new_tokens: int = NEW_TOKENS):
    from transformers import GenerationConfig

    return GenerationConfig(do_sample=do_sample, temperature=cfg.temperature if do_sample else None,
                            top_k=cfg.top_k if do_sample else None, top_p=cfg.top_p if do_sample else None,
                            max_new_tokens=new_tokens, pad_token_id=0, bos_token_id=None, eos_token_id=None)


def sequence_law(cfg: SamplingConfig) -> torch.Tensor:
    """[VOCAB ** NEW_TOKENS] float64: the law of the target's ``generate(do_sample=True)`` under ``cfg``, the
    product of its per-prefix step laws (transformers' logits processors, then softmax), sequences in the order of
    :func:`markov_models.all_sequences`."""
    model = tiny_models()["target"]
    processors = model._get_logits_processor(_generation_config(cfg), input_ids_seq_length=len(PROMPT), device="cpu")
    seqs = all_sequences(VOCAB, NEW_TOKENS)
    law = torch.ones(seqs.shape[0], dtype=torch.float64)
    with torch.no_grad():
        for t in range(NEW_TOKENS):
            ids = torch.cat([torch.tensor(PROMPT).expand(seqs.shape[0], -1), seqs[:, :t]], dim=1)
            scores = processors(ids, model(ids).logits[:, -1].float())
            law *= scores.softmax(-1).double().gather(1, seqs[:, t:t + 1]).squeeze(1)
    return law


# ----------------------------------------------------------------------------------------------------
# Negative controls: candidate generators that break the q contract, planted verification bugs
# ----------------------------------------------------------------------------------------------------

def _candidate_classes():
    from transformers.generation.candidate_generator import AssistedCandidateGenerator

    class RawLogitsCandidates(AssistedCandidateGenerator):
        """Samples its candidates as transformers does (processed scores) but returns the assistant's raw logits
        as ``q``: the mismatch of transformers issue #47932 (DFlash / MTP drafters before PR #47961)."""

        def _generate_candidates(self, generation_args):
            self.generation_config.output_logits = True
            out = self.assistant_model.generate(**generation_args, **self.assistant_kwargs)
            self.assistant_kwargs["past_key_values"] = out.past_key_values
            return out.sequences, torch.stack(out.logits, dim=1)

    class ArgmaxCandidates(AssistedCandidateGenerator):
        """Proposes the assistant's argmax while returning its processed scores as ``q``, as if sampled."""

        def _generate_candidates(self, generation_args):
            self.generation_config.do_sample = False
            return super()._generate_candidates(generation_args)

    return {"raw-logits": RawLogitsCandidates, "argmax": ArgmaxCandidates}


@contextlib.contextmanager
def _replaced(obj, name: str, value):
    """``obj.name = value`` for the block, then exactly what was there before (an instance attribute removed)."""
    missing = object()
    before = vars(obj).get(name, missing)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if before is missing:
            delattr(obj, name)
        else:
            setattr(obj, name, before)


@contextlib.contextmanager
def _case_patches(case: AssistedCase, models: dict):
    """The case's assistant confidence threshold, candidate generator and verification function, for the block."""
    with contextlib.ExitStack() as stack:
        if case.assistant is not None and case.confidence is not None:
            stack.enter_context(_replaced(models[case.assistant].generation_config, "assistant_confidence_threshold",
                                          case.confidence))
        if case.candidates != "sampled":
            cls = _candidate_classes()[case.candidates]

            def candidate_generator(**kw):
                return cls(input_ids=kw["input_ids"], assistant_model=kw["assistant_model"],
                           generation_config=kw["generation_config"], model_kwargs=kw["model_kwargs"],
                           inputs_tensor=kw["inputs_tensor"], logits_processor=kw["logits_processor"])

            stack.enter_context(_replaced(models["target"], "_get_candidate_generator", candidate_generator))
        if case.bug is not None:
            utils = importlib.import_module("transformers.generation.utils")
            double = transformers_target.contract_double(mutant_verifier(case.bug))
            stack.enter_context(_replaced(utils, "_speculative_sampling", double))
        yield


@dataclass
class VerificationStats:
    """What ``_speculative_sampling`` saw over a case's generations: calls, candidates, candidates accepted."""

    calls: int = 0
    candidates: int = 0
    accepted: int = 0

    def describe(self) -> str:
        return f"{self.calls:,} verification calls, {self.accepted:,} of {self.candidates:,} candidates accepted"


def generate_sequences(case: AssistedCase, num: int) -> tuple[torch.Tensor, VerificationStats]:
    """[num, NEW_TOKENS] int64 tokens of ``num`` seeded generations of ``case`` (a row of -1 where a generation
    returned another length), and what ``_speculative_sampling`` saw meanwhile."""
    models = tiny_models()
    utils = importlib.import_module("transformers.generation.utils")
    out = torch.full((num, NEW_TOKENS), -1, dtype=torch.int64)
    prompt = torch.tensor([PROMPT])
    config = _generation_config(case.cfg)
    kwargs = {} if case.assistant is None else {"assistant_model": models[case.assistant]}
    stats = VerificationStats()
    with _case_patches(case, models):
        inner = utils._speculative_sampling

        def counted(candidate_input_ids, candidate_logits, candidate_length, new_logits, **kw):
            tokens, matches = inner(candidate_input_ids, candidate_logits, candidate_length, new_logits, **kw)
            stats.calls += 1
            stats.candidates += int(candidate_length)
            stats.accepted += int(matches)
            return tokens, matches

        with _replaced(utils, "_speculative_sampling", counted), torch.random.fork_rng(devices=[]), torch.no_grad():
            for i in range(num):
                torch.manual_seed(case.seed * 1_000_000 + i)
                new = models["target"].generate(prompt, generation_config=config, **kwargs)[0, len(PROMPT):]
                if new.numel() == NEW_TOKENS:
                    out[i] = new
    return out, stats


def check_case(case: AssistedCase, alpha: float, tv: float, power: float) -> tuple[LawCheck, VerificationStats]:
    """Goodness of fit of ``case``'s generated sequences to :func:`sequence_law` (sample size from the power
    calculation, as the suite's law cases), and what ``_speculative_sampling`` saw."""
    law = sequence_law(case.cfg)
    n = gof.sample_size(law, alpha, tv, power)
    tokens, stats = generate_sequences(case, n)
    valid = ((tokens >= 0) & (tokens < VOCAB)).all(dim=1)
    counts = torch.bincount(encode_sequences(tokens[valid], VOCAB), minlength=VOCAB ** NEW_TOKENS)
    observed = torch.cat([counts, counts.new_tensor([int((~valid).sum())])])
    expected = torch.cat([law, law.new_zeros(1)])
    return LawCheck(gof.gof_test(observed, expected / expected.sum()), n, expected, observed), stats


def _law_outcome(family: str, case: AssistedCase, opts: AuditOptions, expect_reject: bool) -> Outcome:
    tv = opts.mutant_tv if expect_reject else opts.tv
    start = time.perf_counter()
    try:
        check, stats = check_case(case, opts.alpha, tv, opts.power)
    except Exception as exc:
        return Outcome(family, case.name, ERROR, _one_line(exc), seconds=time.perf_counter() - start)
    res = check.result
    rejects = res.rejects(opts.alpha)
    verdict = (CAUGHT if rejects else MISSED) if expect_reject else (FAIL if rejects else PASS)
    detail = case.label() + (f"; {stats.describe()}" if case.assistant else "")
    return Outcome(family, case.name, verdict, detail, num_samples=check.num_samples,
                   statistic=float(res.statistic), df=int(res.df), pvalue=float(res.pvalue), alpha=opts.alpha,
                   test=res.method, power=design_power(check.expected[:-1], check.num_samples, opts.alpha, tv),
                   tv=tv, cells=_worst_cells(case, check) if rejects else None, seconds=time.perf_counter() - start)


def _greedy_outcome(name: str) -> Outcome:
    """``do_sample=False`` assisted generation against the target's own greedy ``generate``, token for token."""
    start = time.perf_counter()
    models = tiny_models()
    assistant = models[name.rsplit("-", 1)[1]]
    config = _generation_config(SamplingConfig(0.0), do_sample=False, new_tokens=GREEDY_TOKENS)
    g = torch.Generator().manual_seed(31)
    prompts = torch.randint(0, VOCAB, (GREEDY_PROMPTS, 3), generator=g)
    wrong = []
    try:
        with torch.no_grad():
            for prompt in prompts:
                alone = models["target"].generate(prompt[None], generation_config=config)[0]
                assisted = models["target"].generate(prompt[None], generation_config=config,
                                                     assistant_model=assistant)[0]
                if not torch.equal(alone, assisted):
                    wrong.append((prompt.tolist(), alone[3:].tolist(), assisted[3:].tolist()))
    except Exception as exc:
        return Outcome("greedy", name, ERROR, _one_line(exc), seconds=time.perf_counter() - start)
    if wrong:
        prompt, alone, assisted = wrong[0]
        detail = (f"{len(wrong)} of {GREEDY_PROMPTS} prompts differ; prompt {prompt}: alone {alone}, "
                  f"assisted {assisted}")
    else:
        detail = (f"{GREEDY_PROMPTS} prompts, {GREEDY_TOKENS} new tokens each: assisted tokens identical to the "
                  "target's greedy")
    return Outcome("greedy", name, FAIL if wrong else PASS, detail, num_samples=GREEDY_PROMPTS,
                   seconds=time.perf_counter() - start)


@contextlib.contextmanager
def _quiet_transformers():
    """transformers' warnings off for the block (the candidate generator passes ``generation_config`` together with
    ``max_new_tokens`` on every call, and transformers warns each time), its verbosity restored after."""
    from transformers.utils import logging

    before = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(before)


class AssistedGeneration:
    """The :class:`.audit_target.System` of this target: its law cases, greedy identity and negative controls."""

    families = ("sequence", "greedy", "mutants")

    def case_names(self, family: str) -> list[str]:
        names = {"sequence": [c.name for c in CASES], "greedy": list(GREEDY_CASES),
                 "mutants": [c.name for c in CONTROLS]}
        return names.get(family, [])

    def run(self, family: str, options: AuditOptions) -> Iterator[Outcome]:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # models of 16 channels: more threads only wait on each other (20x slower on 2)
        try:
            with _quiet_transformers():
                yield from self._run(family, options)
        finally:
            torch.set_num_threads(threads)

    def _run(self, family: str, options: AuditOptions) -> Iterator[Outcome]:
        if family == "sequence":
            for case in CASES:
                if options.selected(case.name, family):
                    yield _law_outcome(family, case, options, expect_reject=False)
        elif family == "greedy":
            for name in GREEDY_CASES:
                if options.selected(name, family):
                    yield _greedy_outcome(name)
        elif family == "mutants":
            for case in CONTROLS:
                if options.selected(case.name, family):
                    yield _law_outcome(family, case, options, expect_reject=True)


DESCRIPTION = (
    "Hugging Face transformers assisted generation end to end: `target.generate(prompt, assistant_model=assistant, "
    "do_sample=True)` with the stock AssistedCandidateGenerator (the assistant samples its candidates with the "
    "target's generation config and logits processors and returns the scores it sampled from), KV caches, "
    f"candidate counts and the assistant's confidence stopping as shipped. Tiny Llamas from seeded random weights "
    f"sharing a {VOCAB}-token vocabulary (target; a close assistant, the target's output head perturbed; a far one, "
    f"independent weights); prompt {list(PROMPT)}, {NEW_TOKENS} new tokens, each generation seeded by "
    "torch.manual_seed, on one torch thread. Law: the target's own generate(do_sample=True), softmax of its "
    "logits after transformers' "
    "logits processors, enumerated over every sequence. Negative controls: a candidate generator returning raw "
    "logits as q while sampling from the processed ones (transformers #47932), one proposing the assistant's "
    "argmax with its scores as q, and planted verification bugs in `_speculative_sampling`'s place.")


def target() -> AuditTarget:
    name = "transformers-assisted"
    try:
        importlib.import_module("transformers.generation.candidate_generator")
        from transformers import LlamaForCausalLM  # noqa: F401
    except ImportError as exc:
        return AuditTarget(name, DESCRIPTION, None, refusal=f"transformers is not installed ({exc}); it needs "
                                                                f"transformers>={transformers_target.MIN_VERSION}")
    base = transformers_target.target()
    if base.verify is None:
        return AuditTarget(name, DESCRIPTION, None, refusal=base.refusal)
    return AuditTarget(name, DESCRIPTION, base.verify, system=AssistedGeneration(), versions=base.versions)
