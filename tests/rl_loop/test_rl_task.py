"""rl_loop.task: problems, reward, splits, tokenizer."""

from __future__ import annotations

import random

import pytest
import torch

from rl_loop.task import (
    CORRECT_REWARD,
    FAMILIES,
    FORMAT_REWARD,
    CharTokenizer,
    Problem,
    TaskConfig,
    make_problem,
    make_splits,
    reward,
)

pytestmark = pytest.mark.rl
torch.set_num_threads(1)  # tiny shapes: extra threads only add synchronisation overhead


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("difficulty", [1, 2, 3, 4])
def test_reference_solutions_score_full_reward(family, difficulty):
    rng = random.Random(difficulty)
    for _ in range(50):
        p = make_problem(rng, family, difficulty)
        assert reward(p, p.solution) == CORRECT_REWARD
        assert reward(p, p.solution, finished=False) == 0.0  # truncated at the length cap


def test_wrong_answer_gets_format_reward_only():
    p = make_problem(random.Random(0), "add", 2)
    scratch, ans = p.solution.split(";")
    assert reward(p, f"{scratch};{int(ans) + 1}") == FORMAT_REWARD
    assert reward(p, "") == 0.0
    assert reward(p, ans) == 0.0  # no scratchpad / separator
    assert reward(p, p.solution + ";") == 0.0


def test_countdown_accepts_any_valid_derivation_and_rejects_invalid_ones():
    p = Problem("countdown", "3,5,7>22?", "5*3=15,15+7=22;22", 22, (3, 5, 7))
    assert reward(p, "3*5=15,7+15=22;22") == CORRECT_REWARD
    assert reward(p, "3*5=15,15+7=23;23") == FORMAT_REWARD  # wrong target
    assert reward(p, "3*5=16,16+6=22;22") == FORMAT_REWARD  # arithmetic error, unknown operand
    assert reward(p, "5*5=25,25-3=22;22") == FORMAT_REWARD  # 5 used twice
    assert reward(p, "3*5=15;15") == FORMAT_REWARD  # number left unused / wrong final


def test_splits_are_seeded_and_disjoint():
    cfg = TaskConfig(num_train=300, num_val=40, seed=3)
    train, val = make_splits(cfg)
    train2, val2 = make_splits(cfg)
    assert [p.prompt for p in train] == [p.prompt for p in train2] and val == val2
    assert len(train) == 300 and len(val) == 40
    assert not {p.prompt for p in train} & {p.prompt for p in val}
    other, _ = make_splits(TaskConfig(num_train=300, num_val=40, seed=4))
    assert [p.prompt for p in other] != [p.prompt for p in train]


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="family"):
        make_problem(random.Random(0), "division", 1)
    with pytest.raises(ValueError, match="difficulty"):
        make_problem(random.Random(0), "add", 9)
    with pytest.raises(ValueError, match="families"):
        make_splits(TaskConfig(families=("nope",)))
    with pytest.raises(ValueError, match="alphabet"):
        CharTokenizer().encode("12a")


@pytest.mark.slow
def test_tokenizer_round_trip_matches_the_tokenizers_model(tmp_path):
    tok = CharTokenizer()
    text = "347*6?7*6+0=42,4*6+4=28;2082"
    ids = tok.encode(text, bos=True)
    assert ids[0] == tok.bos_id and max(ids) < tok.vocab_size
    assert tok.tokenizer.encode(text).ids == ids[1:]  # the fast path agrees with the tokenizers model
    assert tok.decode(ids[1:] + [tok.eos_id, ids[2]]) == text  # stops at EOS
    tok.save(str(tmp_path))
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    assert hf(text, add_special_tokens=False).input_ids == ids[1:]
    assert hf.eos_token_id == tok.eos_id
