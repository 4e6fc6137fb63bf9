"""User mistakes found before any work: :class:`UsageError` (the CLIs print it as one line), the one-line
argument parser of every rl_loop command, and the check of an output directory shared by ``python -m rl_loop``
and ``python -m rl_loop.sim sweep`` (stdlib only)."""

from __future__ import annotations

import argparse
import os
import tempfile


class UsageError(ValueError):
    """A run that cannot start as asked (a flag's value, OUT's state), found before any work."""


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (no usage block): ``PROG: error: ...``."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def check_out_dir(out: str, flag: str = "--out") -> None:
    """``out`` is, or can be created as, a writable directory (it is created here when missing)."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"{flag} {out} is a file, not a directory")
    parent = os.path.dirname(os.path.abspath(out))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise UsageError(f"{flag} {out} lies under {parent}, which is a file")
    try:
        os.makedirs(out, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        raise UsageError(f"{flag} {out} is not writable ({e.strerror or e})") from e
