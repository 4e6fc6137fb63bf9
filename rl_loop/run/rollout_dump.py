"""``--dump-rollouts``: every step's requests and responses in ``OUT/rollouts.jsonl``, so that runs compare.

One line per step: ``{"step", "seeds", "responses", "finished"}`` (request order; responses are token ids
without EOS). Two runs with the same seeds must write the same lines whatever their rollout workers.
"""

from __future__ import annotations

import json
import os

from ..step.rollouts import Rollouts


def dump_path(out: str) -> str:
    """The dump of the run writing into ``out``."""
    return os.path.join(out, "rollouts.jsonl")


def reset_dump(out: str) -> None:
    """Start an empty dump (a fresh run does; a resumed one appends to its dump)."""
    if os.path.exists(dump_path(out)):
        os.remove(dump_path(out))


def dump_rollouts(out: str, step: int, seeds: list[int], rollouts: Rollouts) -> None:
    """Append step ``step``'s line to the dump in ``out``."""
    line = {"step": step, "seeds": seeds, "responses": rollouts.response_ids, "finished": rollouts.finished}
    with open(dump_path(out), "a") as f:
        f.write(json.dumps(line) + "\n")


def read_dump(path: str) -> list[dict]:
    """The lines of a dump, in order."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
