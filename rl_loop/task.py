"""Seeded math problems with verifiable answers, their reward, splits and a character tokenizer.

Problem families, each with a short scratchpad so that responses are tens of tokens long (the regime
where speculative decoding pays off) and every step is checkable:

- ``add`` / ``mul`` (multi-digit arithmetic): ``"347+585?"`` -> ``"7+5+0=12,4+8+1=13,3+5+1=9;932"``.
  One step per digit, least significant first, carry explicit; the answer follows ``;``.
  ``mul`` multiplies by one digit: ``"347*6?"`` -> ``"7*6+0=42,4*6+4=28,3*6+2=20;2082"``.
- ``countdown``: reach the target from three numbers with ``+ - *``, each used once:
  ``"3,5,7>22?"`` -> ``"5*3=15,15+7=22;22"``. Any valid derivation is correct.
- ``search`` (not in the default mix): countdown written as a search trace. The reference response
  tries whole derivations in a random order and abandons each wrong one with ``>`` before the one that
  reaches the target: ``"3,5,7>22?"`` -> ``"7-3=4,4*5=20>5*3=15,15+7=22;22"`` (at most two failed tries
  shown). Which try comes next is a free choice, so the policy's responses vary far more from sample to
  sample than the templated families' do: the workload whose draft acceptance is nearer what RL
  reasoning traces see. Correct when the last try reaches the target and every try is a valid
  derivation.

Difficulty 1..4 sets the digit count of arithmetic (difficulty + 1 digits for addition, difficulty digits
times one digit for multiplication); countdown uses numbers 1..(3 + 2 * difficulty).

The reward is exact-answer correctness plus a small format term: 1.0 when the answer is correct, 0.1 when
the response is well formed (scratchpad, ``;``, integer, end of sequence) but wrong, 0 otherwise.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
SPECIAL_TOKENS = (PAD, BOS, EOS)
CHARS = "0123456789+-*=,;?>"
VOCAB_SIZE = 32  # padded: the embedding keeps a few unused rows (vLLM and matmuls like round sizes)
FAMILIES = ("add", "mul", "countdown", "search")
DEFAULT_FAMILIES = ("add", "mul", "countdown")
SEARCH_MAX_FAILED = 2  # failed tries a ``search`` reference response shows before the successful one
CORRECT_REWARD = 1.0
FORMAT_REWARD = 0.1


@dataclass(frozen=True)
class Problem:
    """One problem: the prompt text (without BOS), a reference solution and what the checker needs."""

    family: str
    prompt: str
    solution: str  # reference response (without EOS)
    answer: int  # exact answer (countdown: the target)
    numbers: tuple[int, ...]  # operands (countdown: the pool)


# ----------------------------------------------------------------------------------------------------
# Generators
# ----------------------------------------------------------------------------------------------------

def _addition(rng: random.Random, difficulty: int) -> Problem:
    digits = difficulty + 1
    a = rng.randrange(10 ** (digits - 1), 10**digits)
    b = rng.randrange(10 ** (digits - 1), 10**digits)
    steps, carry = [], 0
    da, db = str(a)[::-1], str(b)[::-1]
    for i in range(digits):
        x, y = int(da[i]), int(db[i])
        s = x + y + carry
        steps.append(f"{x}+{y}+{carry}={s}")
        carry = s // 10
    return Problem("add", f"{a}+{b}?", ",".join(steps) + f";{a + b}", a + b, (a, b))


def _multiplication(rng: random.Random, difficulty: int) -> Problem:
    digits = difficulty
    a = rng.randrange(10 ** (digits - 1) if digits > 1 else 2, 10**digits)
    m = rng.randrange(2, 10)
    steps, carry = [], 0
    for ch in str(a)[::-1]:
        s = int(ch) * m + carry
        steps.append(f"{ch}*{m}+{carry}={s}")
        carry = s // 10
    return Problem("mul", f"{a}*{m}?", ",".join(steps) + f";{a * m}", a * m, (a, m))


def _apply(op: str, x: int, y: int) -> int:
    return x + y if op == "+" else x - y if op == "-" else x * y


def _countdown(rng: random.Random, difficulty: int) -> Problem:
    high = 3 + 2 * difficulty
    while True:
        nums = [rng.randint(1, high) for _ in range(3)]
        order = nums[:]
        rng.shuffle(order)
        op1, op2 = rng.choice("+-*"), rng.choice("+-*")
        first = _apply(op1, order[0], order[1])
        target = _apply(op2, first, order[2])
        if first >= 0 and target > 0:
            break
    solution = f"{order[0]}{op1}{order[1]}={first},{first}{op2}{order[2]}={target};{target}"
    prompt = ",".join(map(str, nums)) + f">{target}?"
    return Problem("countdown", prompt, solution, target, tuple(nums))


def _derivations(nums: list[int]) -> list[tuple[int, str, int, int, str, int, int]]:
    """Every two-step derivation over three numbers: (x, op1, y, first, op2, z, result), ``first`` >= 0."""
    out = []
    for i, j, k in ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)):
        x, y, z = nums[i], nums[j], nums[k]
        for op1 in "+-*":
            first = _apply(op1, x, y)
            if first < 0:
                continue
            for op2 in "+-*":
                out.append((x, op1, y, first, op2, z, _apply(op2, first, z)))
    return out


def _search(rng: random.Random, difficulty: int) -> Problem:
    base = _countdown(rng, difficulty)
    tries = _derivations(list(base.numbers))
    rng.shuffle(tries)
    hit = next(i for i, d in enumerate(tries) if d[6] == base.answer)
    failed = [d for d in tries[:hit] if d[6] != base.answer][:SEARCH_MAX_FAILED]
    text = ">".join(f"{x}{o1}{y}={f},{f}{o2}{z}={r}" for x, o1, y, f, o2, z, r in (*failed, tries[hit]))
    return Problem("search", base.prompt, f"{text};{base.answer}", base.answer, base.numbers)


_GENERATORS = {"add": _addition, "mul": _multiplication, "countdown": _countdown, "search": _search}


def make_problem(rng: random.Random, family: str, difficulty: int) -> Problem:
    """One problem of ``family`` at ``difficulty`` (1..4) drawn from ``rng``."""
    if family not in _GENERATORS:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    if not 1 <= difficulty <= 4:
        raise ValueError(f"difficulty must be in [1, 4], got {difficulty}")
    return _GENERATORS[family](rng, difficulty)


@dataclass(frozen=True)
class TaskConfig:
    """Which problems a run trains and validates on."""

    families: tuple[str, ...] = DEFAULT_FAMILIES
    difficulties: tuple[int, ...] = (1, 2)
    num_train: int = 4096
    num_val: int = 512
    seed: int = 0


def make_splits(config: TaskConfig) -> tuple[list[Problem], list[Problem]]:
    """Disjoint train and validation problem lists (validation prompts never appear in train)."""
    for family in config.families:
        if family not in _GENERATORS:
            raise ValueError(f"families must be drawn from {FAMILIES}, got {family!r}")
    rng = random.Random(config.seed)
    seen: set[str] = set()
    val: list[Problem] = []
    train: list[Problem] = []
    attempts = 0
    while len(val) < config.num_val or len(train) < config.num_train:
        attempts += 1
        if attempts > 50 * (config.num_train + config.num_val):
            raise ValueError("not enough distinct problems for the requested split sizes")
        p = make_problem(rng, rng.choice(config.families), rng.choice(config.difficulties))
        if p.prompt in seen:
            continue
        seen.add(p.prompt)
        (val if len(val) < config.num_val else train).append(p)
    return train, val


# ----------------------------------------------------------------------------------------------------
# Reward
# ----------------------------------------------------------------------------------------------------

_STEP = re.compile(r"^(-?\d+)([+\-*])(\d+)(?:\+(\d+))?=(-?\d+)$")


def _valid_derivation(problem: Problem, scratch: str) -> int | None:
    """The value a derivation ``scratch`` ends at when every step is valid over the pool, else None."""
    pool = list(problem.numbers)
    for step in scratch.split(","):
        m = _STEP.match(step)
        if m is None or m.group(4) is not None:
            return None
        x, op, y, z = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(5))
        for value in (x, y):
            if value not in pool:
                return None
            pool.remove(value)
        if _apply(op, x, y) != z:
            return None
        pool.append(z)
    return pool[0] if len(pool) == 1 else None


def _check_countdown(problem: Problem, scratch: str, final: int) -> bool:
    return _valid_derivation(problem, scratch) == problem.answer == final


def _check_search(problem: Problem, scratch: str, final: int) -> bool:
    tries = scratch.split(">")
    values = [_valid_derivation(problem, t) for t in tries]
    return None not in values and values[-1] == problem.answer == final


_RESPONSE = re.compile(r"^([0-9+\-*=,>]+);(-?\d{1,12})$")


def parse_response(text: str) -> tuple[str, int] | None:
    """(scratchpad, final integer) of a well-formed response, else None."""
    m = _RESPONSE.match(text)
    if m is None:
        return None
    return m.group(1), int(m.group(2))


def reward(problem: Problem, response: str, finished: bool = True) -> float:
    """Scalar reward of a decoded response (EOS excluded); ``finished`` is False when it hit the length cap."""
    parsed = parse_response(response) if finished else None
    if parsed is None:
        return 0.0
    scratch, final = parsed
    if ">" in scratch and problem.family != "search":
        return 0.0  # ``>`` abandons a try: only search traces are made of tries
    if problem.family == "countdown":
        correct = _check_countdown(problem, scratch, final)
    elif problem.family == "search":
        correct = _check_search(problem, scratch, final)
    else:
        correct = final == problem.answer
    return CORRECT_REWARD if correct else FORMAT_REWARD


# ----------------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------------

def build_tokenizer() -> Tokenizer:
    """Character-level ``tokenizers`` tokenizer: specials, then one id per character of :data:`CHARS`."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in CHARS:
        vocab[ch] = len(vocab)
    for i in range(len(vocab), VOCAB_SIZE):  # reserved rows, never produced by the tokenizer
        vocab[f"<unused{i}>"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


class CharTokenizer:
    """Thin fast wrapper: encode/decode with a Python dict (the hot path), backed by a ``tokenizers`` model."""

    def __init__(self) -> None:
        self.tokenizer = build_tokenizer()
        vocab = self.tokenizer.get_vocab()
        self.pad_id, self.bos_id, self.eos_id = vocab[PAD], vocab[BOS], vocab[EOS]
        self._encode = {ch: vocab[ch] for ch in CHARS}
        self._decode = {i: ch for ch, i in self._encode.items()}
        self.vocab_size = VOCAB_SIZE

    def encode(self, text: str, bos: bool = False) -> list[int]:
        """Token ids of ``text`` (characters outside the alphabet raise ValueError)."""
        try:
            ids = [self._encode[ch] for ch in text]
        except KeyError as exc:
            raise ValueError(f"text has a character outside the alphabet {CHARS!r}: {exc}") from None
        return [self.bos_id, *ids] if bos else ids

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``, stopping at the first EOS and skipping other special or unused ids."""
        out = []
        for i in ids:
            if i == self.eos_id:
                break
            out.append(self._decode.get(i, ""))
        return "".join(out)

    def save(self, directory: str) -> None:
        """Write ``tokenizer.json`` + ``tokenizer_config.json`` + ``special_tokens_map.json`` (HF / vLLM)."""
        import json
        import os

        os.makedirs(directory, exist_ok=True)
        self.tokenizer.save(os.path.join(directory, "tokenizer.json"))
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": PAD,
            "model_max_length": 1024, "clean_up_tokenization_spaces": False,
        }
        with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
            json.dump(config, f, indent=1)
        with open(os.path.join(directory, "special_tokens_map.json"), "w") as f:
            json.dump({"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": PAD}, f, indent=1)
