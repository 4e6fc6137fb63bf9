"""Every command of the README's and the docs' ```bash / ```sh blocks is checked, most of them without running
them (installs, training runs, benchmarks and GPU runs take minutes to hours):

- ``python -m MODULE ARGS``: the module exists, its ``--help`` runs, every flag in ARGS is one the help lists
  (a subcommand's help, ``python -m MODULE SUB --help``, where the flag is not in the top-level help or the
  top-level help names SUB), a value given to a flag with listed choices is one of them, and so is a
  positional with listed choices;
- ``python -c CODE``: it compiles, every ``from X import Y`` resolves, and a call to an imported name binds
  the keywords it passes;
- ``pytest PATHS`` / ``python -m pytest``: every path exists (``--pyargs``: every module), every flag is in
  ``pytest --help``; with ``-k`` every path still collects a test (``pytest --collect-only``);
- ``pip install``: its flags are pip's, an editable path exists in the repo and its extras are pyproject's, a
  pinned version is the one .ci/run installs and an unpinned name is one .ci/run or pyproject names;
- ``export NAME=...`` and ``NAME=... command``: a ``SPECDEC_`` variable is one the code reads, any other is
  in :data:`THIRD_PARTY_ENV` or, for ``NAME=... bash SCRIPT``, one that SCRIPT reads (``$NAME``, ``${NAME...}``);
- ``cat > FILE <<TAG`` heredocs: a Python body compiles; ``python FILE`` runs a repo file or one the block
  wrote; ``. DIR/bin/activate`` follows a ``python -m venv DIR`` of the same block; ``bash SCRIPT`` exists;
  ``grep`` only as a filter after a pipe.

The commands in :data:`RUN_AS_WRITTEN` (seconds each) also run as written and must exit 0. A command of no
kind above fails the test: a new kind of block is handled here deliberately. The planted blocks at the end
show that each check can fail.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the TOML parser pip vendors
    from pip._vendor import tomli as tomllib

DOC_FILES = (REPO / "README.md", REPO / "benchmarks" / "README.md", *sorted((REPO / "docs").glob("*.md")))

RUN_AS_WRITTEN = (
    "python -m rl_loop --help",
    "python -m rl_loop.sim --preset paper-8b-think",
    "python -m rl_loop.sim --preset paper-235b --k 4 --json",
)
"""Commands (comments stripped) that take seconds: the test runs them as written (``python`` is this
interpreter, the working directory the repo root)."""

THIRD_PARTY_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "vLLM's CPU KV-cache size in GiB",
    "TRITON_INTERPRET": "Triton's interpreter mode (kernels on the CPU)",
}
"""Environment variables the docs set that are read by another project, not by ours."""

PYTHONS = ("python", "python3", ".venv/bin/python")
SEPARATORS = ("&&", "||", "|", ";")

# ```bash or ```sh fences, indented ones (inside a list item) included
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?:bash|sh)[ \t]*\n(?P<body>.*?)^(?P=indent)```", flags=re.M | re.S)
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)(?P<tag>\w+)\1")
_ASSIGN = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)=")
_REDIRECT = re.compile(r"^\d*>&\d+$")


@dataclass(frozen=True)
class Command:
    """One command line of a block: ``text`` with continuations joined, ``heredoc`` the body it feeds."""

    where: str  # file:line
    text: str
    heredoc: str | None = None


@dataclass(frozen=True)
class Block:
    where: str
    commands: tuple[Command, ...]


def shell_blocks(text: str, name: str) -> list[Block]:
    """The ```bash / ```sh blocks of a markdown text, each as its command lines."""
    blocks = []
    for m in _FENCE.finditer(text):
        first = text[:m.start("body")].count("\n") + 1
        lines = textwrap.dedent(m.group("body")).splitlines()
        commands, i = [], 0
        while i < len(lines):
            start, line = i, lines[i]
            while line.endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line[:-1] + " " + lines[i].strip()
            heredoc = None
            tag = _HEREDOC.search(line)
            if tag:
                end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == tag.group("tag")), len(lines))
                heredoc, i = "\n".join(lines[i + 1:end]) + "\n", end
            if line.strip() and not line.lstrip().startswith("#"):
                commands.append(Command(f"{name}:{first + start}", line.strip(), heredoc))
            i += 1
        blocks.append(Block(f"{name}:{first}", tuple(commands)))
    return blocks


def doc_blocks() -> list[Block]:
    return [b for path in DOC_FILES for b in shell_blocks(path.read_text(), path.relative_to(REPO).as_posix())]


def words(command: Command) -> list[tuple[str, list[str]]]:
    """The simple commands of one line, each with the operator before it ("" for the first; split at ``&&``,
    ``||``, ``|``, ``;``), comments and ``2>&1`` removed."""
    line = _HEREDOC.sub("<<HEREDOC", command.text)
    tokens = [t for t in shlex.split(line, comments=True) if not _REDIRECT.match(t)]
    parts, before, current = [], "", []
    for t in tokens:
        if t in SEPARATORS:
            parts.append((before, current))
            before, current = t, []
        else:
            current.append(t)
    return [(op, argv) for op, argv in parts + [(before, current)] if argv]


def command_text(command: Command) -> str:
    """The command as the allow-list names it: the words, comments stripped, one space apart."""
    return " ".join(f"{op} {shlex.join(argv)}".strip() for op, argv in words(command))


# the CLIs' own help ------------------------------------------------------------------------------------------

def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@functools.cache
def help_text(*args: str) -> str | None:
    """``python ARGS --help`` from the repo root (None when it fails)."""
    r = subprocess.run([sys.executable, *args, "--help"], capture_output=True, text=True, cwd=REPO, env=_env(),
                       timeout=180)
    return r.stdout if r.returncode == 0 else None


@dataclass(frozen=True)
class Cli:
    """What a ``--help`` lists: ``flags`` (each to whether it takes a value), the choices of flags that list them
    and the choices of the positionals that do."""

    prog: str
    flags: dict[str, bool]
    choices: dict[str, tuple[str, ...]]
    positional_choices: tuple[tuple[str, ...], ...]


def parse_help(text: str) -> Cli:
    """The flags and choices of an argparse-style help (argparse's own, pytest's, pip's)."""
    prog = re.match(r"usage:\s*(.*?)\s*(?:\[|$)", text, flags=re.M).group(1) if text.startswith("usage:") else ""
    flags: dict[str, bool] = {}
    choices: dict[str, tuple[str, ...]] = {}
    positional: list[tuple[str, ...]] = []
    section = ""
    for line in text.splitlines():
        if re.match(r"^\S.*:$", line):
            section = line
            continue
        m = re.match(r"^ {2,}(-\S.*?)(?: {2,}|$)", line)
        if m:  # "  -k EXPRESSION   help", "  --preset {a,b}", "  -h, --help", "  -e, --editable <path>"
            invocations = [re.split(r"[ =]", i, maxsplit=1) + [""] for i in m.group(1).split(", ")]
            takes_value = any(value for _, value, *_ in invocations)
            for flag, value, *_ in invocations:
                if re.fullmatch(r"--?[A-Za-z0-9][\w-]*", flag):
                    flags[flag] = takes_value
                    listed = re.match(r"\{([^}]*)\}", value)
                    if listed:
                        choices[flag] = tuple(listed.group(1).split(","))
        elif section.startswith("positional arguments") and (listed := re.match(r"^ {2,}\{([^}]*)\}", line)):
            positional.append(tuple(listed.group(1).split(",")))
    return Cli(prog, flags, choices, tuple(positional))


def _positionals(args: list[str], cli: Cli) -> list[str]:
    """The arguments that are neither flags nor a flag's value."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a.startswith("-"):
            skip = "=" not in a and cli.flags.get(a, False)
        else:
            out.append(a)
    return out


def _flag_problems(args: list[str], cli: Cli, what: str) -> list[str]:
    """Flags ``cli`` does not list, and values outside a flag's listed choices."""
    problems = []
    for i, a in enumerate(args):
        if not a.startswith("-") or a == "-":
            continue
        flag, eq, value = a.partition("=")
        if flag not in cli.flags:
            problems.append(f"{what} has no flag {flag}")
            continue
        if not eq and cli.flags[flag] and i + 1 < len(args):
            value = args[i + 1]
        if flag in cli.choices and (eq or cli.flags[flag]) and value not in cli.choices[flag]:
            problems.append(f"{what} {flag}: {value!r} is not one of {', '.join(cli.choices[flag])}")
    return problems


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def module_problems(module: str, args: list[str]) -> list[str]:
    """``python -m module args``: the module, its help, the flags and the listed choices."""
    if not _module_exists(module):
        return [f"no module {module}"]
    top = help_text("-m", module)
    if top is None:
        return [f"python -m {module} --help fails"]
    cli = parse_help(top)
    first = args[0] if args and not args[0].startswith("-") else None
    named = first is not None and re.search(rf"(?<![\w-]){re.escape(first)}(?![\w-])", top)
    missing = any(a.startswith("-") and a.partition("=")[0] not in cli.flags for a in args)
    what = f"python -m {module}"
    if first is not None and (missing or named):
        sub = help_text("-m", module, first)
        if sub is not None and re.search(rf"{re.escape(module)}\s+{re.escape(first)}\b", parse_help(sub).prog):
            cli, args, what = parse_help(sub), args[1:], f"python -m {module} {first}"
    problems = _flag_problems(args, cli, what)
    # the help's positionals with listed choices, in order, against the command's first positionals (the CLIs
    # here have at most one positional with choices, and it comes first)
    for value, listed in zip(_positionals(args, cli), cli.positional_choices, strict=False):
        if value not in listed:
            problems.append(f"{what}: {value!r} is not one of {', '.join(listed)}")
    return problems


def code_problems(code: str) -> list[str]:
    """``python -c code``: it compiles; ``from X import Y`` resolves; calls of Y bind their keywords."""
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        return [f"python -c code does not compile: {e.msg}"]
    problems, imported = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            try:
                module = importlib.import_module(node.module)
            except ImportError:
                problems.append(f"no module {node.module}")
                continue
            for alias in node.names:
                if hasattr(module, alias.name):
                    imported[alias.asname or alias.name] = getattr(module, alias.name)
                else:
                    problems.append(f"{node.module} has no {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and callable(imported.get(node.func.id)):
            keywords = {k.arg: None for k in node.keywords if k.arg}
            try:
                inspect.signature(imported[node.func.id]).bind_partial(**keywords)
            except TypeError as e:
                problems.append(f"{node.func.id}({', '.join(keywords)}=...): {e}")
            except ValueError:  # no signature to check (a builtin)
                pass
    return problems


@functools.cache
def collected(paths: tuple[str, ...], expression: str) -> str | None:
    """``pytest --collect-only -q PATHS -k EXPRESSION``'s node ids (None when collection fails)."""
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist",
                        "-p", "no:cacheprovider", *paths, "-k", expression],
                       capture_output=True, text=True, cwd=REPO, env=_env(), timeout=300)
    return r.stdout if r.returncode in (0, 5) else None


def pytest_problems(args: list[str]) -> list[str]:
    """``pytest args``: paths (or ``--pyargs`` modules) exist, flags are pytest's, ``-k`` keeps a test per path."""
    flagged = any(a.startswith("-") for a in args)  # pytest --help takes seconds: asked only when needed
    cli = parse_help(help_text("-m", "pytest") or "") if flagged else Cli("pytest", {}, {}, ())
    problems = _flag_problems(args, cli, "pytest")
    targets = _positionals(args, cli)
    expression = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "-k"), None)
    if "--pyargs" in args:
        return problems + [f"no module {t}" for t in targets if not _module_exists(t)]
    missing = [t for t in targets if not (REPO / t.split("::")[0]).exists()]
    problems += [f"pytest: no path {t}" for t in missing]
    if expression is not None and targets and not missing:
        ids = collected(tuple(targets), expression)
        if ids is None:
            problems.append(f"pytest --collect-only {' '.join(targets)} -k {expression!r} fails")
        else:
            problems += [f"pytest -k {expression!r} collects no test of {t}" for t in targets
                         if not any(line.startswith(t.split("::")[0]) for line in ids.splitlines())]
    return problems


@functools.cache
def ci_installs() -> dict[str, str | None]:
    """``{name: pinned version or None}`` of the packages the ``pip install`` lines of .ci/run name."""
    out: dict[str, str | None] = {}
    for line in (REPO / ".ci" / "run").read_text().splitlines():
        _, found, rest = line.partition("pip install ")
        for token in shlex.split(rest, comments=True) if found else []:
            m = re.fullmatch(r"([A-Za-z][\w.-]*)(?:==([\w.+-]+))?", token)
            if m:
                out[m.group(1).lower()] = m.group(2)
    return out


@functools.cache
def pyproject_packages() -> frozenset[str]:
    """The package names of pyproject.toml's build requirements, dependencies and extras."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    specs = project["build-system"]["requires"] + project["project"]["dependencies"] + [
        s for deps in project["project"]["optional-dependencies"].values() for s in deps]
    return frozenset(re.match(r"[A-Za-z][\w.-]*", s).group(0).lower() for s in specs)


def pip_problems(args: list[str]) -> list[str]:
    if not args or args[0] != "install":
        return [f"pip {' '.join(args)}: only pip install is checked"]
    args = args[1:]
    flagged = any(a.startswith("-") for a in args)
    cli = parse_help(help_text("-m", "pip", "install") or "") if flagged else Cli("pip install", {}, {}, ())
    problems = _flag_problems(args, cli, "pip install")
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    skip = False
    for a in args:
        if skip or a.startswith("-"):
            skip = a in ("-r", "-c", "--requirement", "--constraint")
            continue
        path, _, rest = a.partition("[")
        if path.startswith(".") or "/" in path:
            if not (REPO / path).exists():
                problems.append(f"pip install: no path {path} in the repo")
            problems += [f"pip install: pyproject has no extra [{e}]" for e in rest.rstrip("]").split(",")
                         if rest and e not in extras]
            continue
        name, pinned, version = re.match(r"([A-Za-z][\w.-]*)(==)?(.*)", a).groups()
        if pinned and ci_installs().get(name.lower()) != version:
            problems.append(f"pip install {a}: .ci/run installs {name}=={ci_installs().get(name.lower())}")
        elif not pinned and name.lower() not in set(ci_installs()) | pyproject_packages():
            problems.append(f"pip install {name}: neither .ci/run nor pyproject.toml names it")
    return problems


@functools.cache
def env_names_read() -> frozenset[str]:
    """The ``SPECDEC_*`` names the project's Python code and build read."""
    files = [REPO / "setup.py", *(REPO / "specdec_kernels").rglob("*.py"), *(REPO / "rl_loop").rglob("*.py"),
             *(REPO / "benchmarks").rglob("*.py")]
    return frozenset(n for f in files for n in re.findall(r"[\"'](SPECDEC_[A-Z0-9_]+)[\"']", f.read_text()))


@functools.cache
def script_env_names(script: str) -> frozenset[str]:
    """The variables a repo shell script reads (``$NAME`` or ``${NAME...}``)."""
    return frozenset(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", (REPO / script).read_text()))


def env_problems(name: str, argv: list[str] | tuple[str, ...] = ()) -> list[str]:
    """``NAME=...`` set for ``argv`` (the command it prefixes; empty for ``export``)."""
    if name.startswith("SPECDEC_"):
        return [] if name in env_names_read() else [f"no code reads ${name}"]
    script = argv[1] if len(argv) >= 2 and argv[0] == "bash" and (REPO / argv[1]).is_file() else None
    if name in THIRD_PARTY_ENV or (script and name in script_env_names(script)):
        return []
    return [f"${name} is neither ours nor in THIRD_PARTY_ENV" + (f" nor read by {script}" if script else "")]


def block_problems(block: Block) -> list[str]:
    """Every problem of one block's commands, each as ``file:line: `command`: problem``."""
    problems, written, venvs = [], set(), set()
    for command in block.commands:
        found = []
        for operator, argv in words(command):
            names = []
            while argv and _ASSIGN.match(argv[0]):
                names.append(_ASSIGN.match(argv[0]).group("name"))
                argv = argv[1:]
            found += [p for name in names for p in env_problems(name, argv)]
            found += simple_problems(argv, command, operator, written, venvs)
        problems += [f"{command.where}: `{command.text}`: {p}" for p in found]
    return problems


def simple_problems(argv: list[str], command: Command, operator: str, written: set[str], venvs: set[str]
                    ) -> list[str]:
    """The problems of one simple command (``operator``: the one before it, "" for the first); ``written`` and
    ``venvs``: the files and virtual environments the block's earlier commands made."""
    if not argv:
        return []
    program, args = argv[0], argv[1:]
    if program in PYTHONS:
        if args[:2] == ["-m", "pytest"]:
            return pytest_problems(args[2:])
        if args[:2] == ["-m", "pip"]:
            return pip_problems(args[2:])
        if args[:2] == ["-m", "venv"]:
            venvs.update(a for a in args[2:] if not a.startswith("-"))
            return module_problems("venv", args[2:])
        if args[:1] == ["-m"] and len(args) > 1:
            return module_problems(args[1], args[2:])
        if args[:1] == ["-c"] and len(args) > 1:
            return code_problems(args[1])
        if args and args[0].endswith(".py"):
            return [] if args[0] in written or (REPO / args[0]).is_file() else [f"no file {args[0]}"]
    elif program == "pytest":
        return pytest_problems(args)
    elif program == "pip":
        return pip_problems(args)
    elif program == "export":
        return [p for a in args for p in env_problems(a.partition("=")[0])]
    elif program in (".", "source") and len(args) == 1:
        ok = any(args[0] == f"{v}/bin/activate" for v in venvs)
        return [] if ok else [f"sources {args[0]}, which no python -m venv of this block made"]
    elif program == "cat" and args[:1] == [">"] and len(args) == 3 and command.heredoc is not None:
        written.add(args[1])
        if args[1].endswith(".py"):
            try:
                compile(command.heredoc, args[1], "exec")
            except SyntaxError as e:
                return [f"{args[1]} does not compile: {e.msg}"]
        return []
    elif program == "bash" and len(args) >= 1:
        return [] if (REPO / args[0]).is_file() else [f"no script {args[0]}"]
    elif program == "grep" and operator == "|":
        return []
    return [f"cannot classify `{shlex.join(argv)}`: handle this kind of command in {Path(__file__).name}"]


# the docs --------------------------------------------------------------------------------------------------

def test_docs_have_the_shell_blocks_this_test_reads():
    blocks = doc_blocks()
    assert len(blocks) >= 14 and all(b.commands for b in blocks), [b.where for b in blocks if not b.commands]
    indented = [b for b in blocks if "rl_loop.experiments.gpu_rollout" in b.commands[0].text]
    assert indented, "the ```bash block inside a list item (docs/rl_loop.md) is not read"


@pytest.mark.slow
def test_every_docs_shell_command_is_valid():
    problems = [p for block in doc_blocks() for p in block_problems(block)]
    assert not problems, "\n".join(problems)


def test_run_as_written_commands_are_in_the_docs():
    """An allow-list entry whose command left the docs goes."""
    shown = {command_text(c) for b in doc_blocks() for c in b.commands}
    assert set(RUN_AS_WRITTEN) <= shown, sorted(set(RUN_AS_WRITTEN) - shown)


@pytest.mark.slow
@pytest.mark.parametrize("command", RUN_AS_WRITTEN)
def test_short_command_runs_as_written(command):
    argv = shlex.split(command)
    argv[0] = sys.executable
    r = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=_env(), timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]


# planted blocks: each check must report its problem ---------------------------------------------------------

def _planted(body: str) -> list[str]:
    (block,) = shell_blocks(f"text\n\n```bash\n{body}```\n", "planted.md")
    return block_problems(block)


@pytest.mark.parametrize(("body", "expected"), [
    ("python -m rl_loop.experiment.repeat --seeds 0,1,2\n", "no module rl_loop.experiment.repeat"),
    ("python -m rl_loop.sim --preset paper-8b-think --kk 4   # k\n", "python -m rl_loop.sim has no flag --kk"),
    ("python -m rl_loop.sim --preset paper-8b-thinking\n", "--preset: 'paper-8b-thinking' is not one of"),
    ("python -m rl_loop.sim --preset=paper-9b\n", "--preset: 'paper-9b' is not one of"),
    ("python -m rl_loop.sim sweep --out x --table speedup_vs_kk\n",
     "python -m rl_loop.sim sweep --table: 'speedup_vs_kk' is not one of"),
    ("python -m rl_loop.sim sweep --preset cpu-here\n", "sweep --preset: 'cpu-here' is not one of"),
    ("pytest tests/rl_loop/test_rl_nope.py\n", "pytest: no path tests/rl_loop/test_rl_nope.py"),
    ("python -m pytest tests/docs/test_readme.py \\\n  tests/docs/test_nope.py\n", "no path tests/docs/test_nope.py"),
    ("python -c \"from rl_loop.sim.engine_costs import build_engines\"\n", "rl_loop.sim.engine_costs has no build_engines"),
    ("python -c \"from rl_loop.sim.engine_costs import build_engine; build_engine(state='/tmp/e.pt')\"\n",
     "build_engine(state=...)"),
    ("python -c \"from rl_loop import (\"\n", "does not compile"),
    ("SPECDEC_VLM=1 python -m rl_loop.sim --preset paper-8b-think\n", "no code reads $SPECDEC_VLM"),
    ("export VLLM_SOMETHING=1\n", "$VLLM_SOMETHING is neither ours nor in THIRD_PARTY_ENV"),
    ("cat > ex.py <<'PY'\nprint(1\nPY\npython ex.py\n", "ex.py does not compile"),
    ("python example.py\n", "no file example.py"),
    (". .venv/bin/activate\n", "which no python -m venv of this block made"),
    ("bash benchmarks/gpu/nope.sh\n", "no script benchmarks/gpu/nope.sh"),
    ("BENCH_DEVICE=cpu OUTT=/tmp/out bash benchmarks/gpu/device_run.sh\n",
     "$OUTT is neither ours nor in THIRD_PARTY_ENV nor read by benchmarks/gpu/device_run.sh"),
    ("OUT=/tmp/out python -m rl_loop.sim --preset paper-8b-think\n", "$OUT is neither ours nor in THIRD_PARTY_ENV"),
    ("make all && python -m rl_loop.sim --preset paper-8b-think\n", "cannot classify `make all`"),
    ("python -m rl_loop.sim --preset paper-8b-think | grep x && grep y\n", "cannot classify `grep y`"),
])
def test_planted_block_is_reported(body, expected):
    problems = _planted(body)
    assert len(problems) == 1 and expected in problems[0], problems


def test_planted_pip_installs_are_reported():
    assert _planted("pip install setuptools wheel\n") == []
    assert _planted("pip install torch==2.12.0\n") == [
        "planted.md:4: `pip install torch==2.12.0`: pip install torch==2.12.0: .ci/run installs torch==2.13.0"]
    (problem,) = _planted("pip install nonesuch-package\n")
    assert "neither .ci/run nor pyproject.toml names it" in problem


@pytest.mark.slow
def test_planted_pip_and_pytest_flags_are_reported():
    """The checks that ask pip, pytest and a torch-importing CLI for their flags, and pytest for what ``-k``
    collects."""
    (problem,) = _planted("python -m rl_loop.sim.preregister predcit --out x\n")
    assert "python -m rl_loop.sim.preregister: 'predcit' is not one of predict, measure" in problem
    (problem,) = _planted("pip install --no-build-isolatoin -e \".[vllm]\"\n")[:1]
    assert "pip install has no flag --no-build-isolatoin" in problem
    assert any("pyproject has no extra [vllm]" in p for p in _planted("pip install -e \".[vllm]\"\n"))
    assert _planted("pytest --pyargs specdec_kernels.audits\n")[0].endswith("no module specdec_kernels.audits")
    assert "pytest has no flag --verifiers" in _planted(
        "pytest --pyargs specdec_kernels.audit --verifiers mypkg.sampler:verify\n")[0]
    (problem,) = _planted("python -m pytest tests/vllm/test_vllm_v2.py -k sampling_mask tests/vllm/test_vllm_033.py\n")
    assert "pytest -k 'sampling_mask' collects no test of tests/vllm/test_vllm_033.py" in problem
