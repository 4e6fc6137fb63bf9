"""Where a committed figure came from: commit, date, CPU, cores, threads and the command that wrote it."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, check=False, cwd=HERE, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def command_line() -> str | None:
    """``python -m <module> <args>`` of this process (no paths of the machine: the module, not its file): the
    dotted name of the file ``python -m`` ran, from the package folders (those with ``__init__.py``) above
    it, ``__main__`` dropped; None for a file outside a package."""
    argv0 = sys.argv[0] if sys.argv else ""
    if not argv0.endswith(".py"):
        return None
    parts = [os.path.basename(argv0)[:-3]]
    folder = os.path.dirname(os.path.abspath(argv0))
    while os.path.isfile(os.path.join(folder, "__init__.py")):
        parts.insert(0, os.path.basename(folder))
        folder = os.path.dirname(folder)
    if len(parts) == 1:
        return None
    module = ".".join(parts[:-1] if parts[-1] == "__main__" else parts)
    return " ".join(["python", "-m", module, *sys.argv[1:]])


def row_provenance(record: dict) -> dict[str, str]:
    """A :func:`provenance` record as the CSV columns of results/README.md: ``command``, ``git_commit``
    (``+dirty`` for a tree with uncommitted changes) and ``device`` (the CPU and the torch threads)."""
    commit = record["commit"] or ""
    threads = f" ({record['threads']} threads)" if record.get("threads") else ""
    return {"command": record["command"] or "", "git_commit": commit + ("+dirty" if record["dirty"] else ""),
            "device": f"{record['cpu']}{threads}"}


RESULTS = "results"
"""The results store (top-level folder): what commands wrote, not code. Its changes do not make a tree dirty,
so a rerun into committed results (``results/rl_loop/default/seed1`` after ``seed0`` was rewritten) still
records that its code was committed; every other change does."""


def provenance(command: str | None = None) -> dict:
    """Commit (and whether the tree had uncommitted changes outside :data:`RESULTS`), date, CPU, cores, torch
    threads, command.

    torch is imported here, not at module level, so stdlib-only tools (the simulator) can record it too;
    without torch, ``threads`` and ``torch`` are None."""
    try:
        import torch
    except ImportError:
        torch = None
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ":/", f":(top,exclude){RESULTS}")
    commit = _git("rev-parse", "HEAD")
    if commit is None:  # a copy of the tree without .git (a lent GPU machine): the commit the caller passes
        commit = os.environ.get("SPECDEC_GIT_COMMIT") or None
    return {"commit": commit, "dirty": None if status is None else bool(status),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "cpu": cpu,
            "cores": os.cpu_count(), "threads": torch and torch.get_num_threads(), "torch": torch and torch.__version__,
            "command": command or command_line()}
