"""Shared benchmark plumbing: timing, copy bandwidth, provenance and CSV output.

Every ``bench_<op>.py`` builds its inputs, asks each provider for a callable, times it with
:func:`time_fn`, and appends rows through :class:`CsvWriter`, so results from different ops and machines
share one format (columns :data:`BASE_COLUMNS` + the op's own columns).
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import torch

RESULTS_DIR = Path(__file__).resolve().parent.parent / "results" / "benchmarks"
REPO_ROOT = Path(__file__).resolve().parent.parent

# Provenance columns repeated on every row, so a CSV row is self-describing after concatenation.
PROVENANCE_COLUMNS = ("device", "torch", "triton", "vllm", "flashinfer", "git_commit", "date_utc")
# Timing columns every benchmark writes.
TIMING_COLUMNS = ("provider", "median_ms", "min_ms", "repeats", "status")
BASE_COLUMNS = PROVENANCE_COLUMNS + TIMING_COLUMNS


@dataclass(frozen=True)
class Timing:
    """Median and minimum wall time of one callable, in milliseconds."""

    median_ms: float
    min_ms: float
    repeats: int


def _package_version(name: str) -> str:
    for dist in (name, f"{name}-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return ""


def git_commit() -> str:
    """Short commit of the repository (``+dirty`` when the tree has uncommitted changes); where git cannot
    tell (a copy of the tree without ``.git``, as on a lent GPU machine), ``$SPECDEC_GIT_COMMIT`` or ""."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("SPECDEC_GIT_COMMIT", "")
    return commit + ("+dirty" if dirty else "")


def device_name(device: torch.device) -> str:
    """Human-readable device: the GPU name, or the CPU model and the threads torch uses."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu} ({torch.get_num_threads()} threads)"


def largest_cache_bytes(sysfs: str | os.PathLike = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """The largest CPU cache (the last level) that Linux reports for cpu0, in bytes; 0 when unknown."""
    sizes = [0]
    for index in Path(sysfs).glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        scale = units.get(text[-1:].upper(), 1)
        digits = text[:-1] if text[-1:].upper() in units else text
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes)


def provenance(device: torch.device) -> dict[str, str]:
    """Device, library versions, git commit and UTC date for the rows of one run."""
    return {
        "device": device_name(device),
        "torch": torch.__version__,
        "triton": _package_version("triton"),
        "vllm": _package_version("vllm"),
        "flashinfer": _package_version("flashinfer-python") or _package_version("flashinfer"),
        "git_commit": git_commit(),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn: Callable[[], object], device: torch.device, warmup: int = 2, repeats: int = 10) -> Timing:
    """Median / min time of ``fn()`` after ``warmup`` calls.

    GPU: CUDA events around each call (after a device sync, so queued work is not counted).
    CPU: ``time.perf_counter`` around each call.
    """
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    if device.type == "cuda":
        for _ in range(repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return Timing(statistics.median(times), min(times), repeats)


def copy_bandwidth_gbs(device: torch.device, num_bytes: int | None = None, repeats: int = 10) -> float:
    """Measured copy bandwidth (GB/s, read + write counted) of copying a large float32 tensor.

    The destination is allocated once, so the timing holds no allocation or page-fault cost.
    """
    if num_bytes is None:
        num_bytes = (1 << 30) if device.type == "cuda" else (1 << 27)
    src = torch.empty(num_bytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src).fill_(0.0)
    timing = time_fn(lambda: dst.copy_(src), device, warmup=2, repeats=repeats)
    return 2 * num_bytes / (timing.median_ms * 1e-3) / 1e9


class CsvWriter:
    """Writes rows with the base columns plus ``extra_columns``; creates the parent folder.

    ``append=True`` adds rows to an existing table (a history) instead of replacing it; its header must
    be these columns (ValueError otherwise), so rows of different runs stay one table.
    """

    def __init__(self, path: str | os.PathLike, extra_columns: Sequence[str], append: bool = False):
        self.path = Path(path)
        self.columns = list(BASE_COLUMNS) + [c for c in extra_columns if c not in BASE_COLUMNS]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        existing = append and self.check_appendable(self.path, extra_columns)
        self._file = open(self.path, "a" if existing else "w", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=self.columns, extrasaction="raise")
        if not existing:
            self._writer.writeheader()

    @staticmethod
    def check_appendable(path: str | os.PathLike, extra_columns: Sequence[str]) -> bool:
        """Whether ``path`` holds a table to append to (False: none or empty); ValueError when its header is
        not the base columns plus ``extra_columns``."""
        path = Path(path)
        if not path.exists() or path.stat().st_size == 0:
            return False
        columns = list(BASE_COLUMNS) + [c for c in extra_columns if c not in BASE_COLUMNS]
        with open(path, newline="") as f:
            header = next(csv.reader(f), [])
        if header != columns:
            raise ValueError(f"{path} has columns {header}, not {columns}: cannot append")
        return True

    def write(self, row: dict) -> None:
        self._writer.writerow({c: row.get(c, "") for c in self.columns})
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> CsvWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def default_csv_path(op: str, device: torch.device) -> Path:
    """``results/benchmarks/<op>_<cpu|cuda>_<UTC timestamp>.csv``."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return RESULTS_DIR / f"{op}_{device.type}_{stamp}.csv"


def read_csv(paths: Iterable[str | os.PathLike]) -> list[dict[str, str]]:
    """Rows of one or more result CSVs."""
    rows: list[dict[str, str]] = []
    for path in paths:
        with open(path, newline="") as f:
            rows.extend(csv.DictReader(f))
    return rows


def choice_list(choices: Sequence[str]) -> Callable[[str], list[str]]:
    """An argparse ``type``: comma-separated names, each one of ``choices`` (a one-line error otherwise)."""
    def parse(text: str) -> list[str]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        bad = [x for x in items if x not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"choose from {','.join(choices)} (got {text!r})")
        return items
    return parse


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a command-line mistake in one line (no usage block): ``PROG: error: ...``."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def require_positive(ap: argparse.ArgumentParser, args: argparse.Namespace, names: Iterable[str]) -> None:
    """``ap.error`` (one line, exit 2) naming the first of the integer options ``names`` that is below 1."""
    for name in names:
        value = getattr(args, name)
        if value < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def parse_int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse_str_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]
