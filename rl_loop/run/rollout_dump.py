"""``--dump-rollouts``: every step's requests and responses in ``OUT/rollouts.jsonl``, so that runs compare.

One line per step: ``{"step", "seeds", "responses", "finished"}`` (request order; responses are token ids
without EOS). Two runs with the same seeds must write the same lines whatever their rollout workers.
"""

from __future__ import annotations

import json
import os

from ..config import RunConfig
from ..step.rollouts import Rollouts


def dump_path(cfg: RunConfig) -> str:
    return os.path.join(cfg.out, "rollouts.jsonl")


def reset_dump(cfg: RunConfig) -> None:
    """A fresh run starts an empty dump; a resumed one appends to it."""
    if cfg.dump_rollouts and not cfg.resume and os.path.exists(dump_path(cfg)):
        os.remove(dump_path(cfg))


def dump_rollouts(cfg: RunConfig, step: int, seeds: list[int], rollouts: Rollouts) -> None:
    """Append step ``step``'s line when ``cfg.dump_rollouts``."""
    if not cfg.dump_rollouts:
        return
    line = {"step": step, "seeds": seeds, "responses": rollouts.response_ids, "finished": rollouts.finished}
    with open(dump_path(cfg), "a") as f:
        f.write(json.dumps(line) + "\n")


def read_dump(path: str) -> list[dict]:
    """The lines of a dump, in order."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
