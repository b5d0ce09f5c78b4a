"""Run every command that README.md and docs/*.md show, and check their links.

Conventions of the pages (one test per page runs its blocks in order):

- A fenced block whose info string is ``bash``, ``sh`` or ``console`` holds commands: each line
  is one command (a line ending in ``\\`` continues on the next); blank lines and lines starting
  with ``#`` are skipped; in ``console`` blocks only lines starting with ``$ `` are commands.
  Each command must exit 0.
- ``bash server``: one command started in the background (a server). The test gives it a free
  port (``--port P`` appended, or the port it names replaced), waits until
  ``http://127.0.0.1:P/health`` answers 200 and stops it when the page is done. In the page's
  later blocks ``127.0.0.1:8000`` and ``localhost:8000`` become ``127.0.0.1:P``.
- ``python`` blocks are run as scripts, in order with the commands.
- A second word ``norun`` (``bash norun``, ``python norun``) marks what cannot run here (a real
  checkpoint, a GPU, a cluster, building virtual environments). Such a command's ``--flags``
  must all appear in the ``--help`` of the project's script it calls (``rwkv7-*``,
  ``python benchmarks/X.py``, ``python tools/X.py``, ``python -m scheduler``, ``rwkv7_apps.serve`` or
  ``rwkv7_apps.tools.serving_bench``); ``make TARGET`` must be a target (``make -n``); a ``python norun``
  block must compile.
- Any other fence (``text``, ``json``, none) is not a command.

Commands are written as run from the repository root with the package installed. Each page
runs in a fresh temporary directory holding a symlink to every top-level entry of the
repository (so ``rwkv7_apps/data/example_prompts.jsonl`` resolves); what a command writes must
be a new relative path there (never through a symlink into the repository). The environment:
``$REPO`` = the repository root, ``PYTHONPATH=$REPO``, ``JAX_PLATFORMS=cpu``, the running
Python's ``bin`` first on ``PATH`` (the console scripts), ``XDG_CACHE_HOME`` one directory for
the whole session (random models and JAX's compilation cache are made once), and
``RWKV7_CUDA_PLUGIN_DIR`` as ``make test`` sets it (else ``.venv/cuda-plugin``).

Also: README.md stays within 8 KB, and every relative link (and ``#anchor``) of the pages
resolves.
"""
from __future__ import annotations

import functools
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PAGE_IDS = [str(p.relative_to(REPO)) for p in PAGES]
BIN = Path(sys.executable).parent
COMMAND_LANGS = {"bash", "sh", "console"}
COMMAND_TIMEOUT = 600
HEALTH_TIMEOUT = 600
README_LIMIT = 8192
# Pages whose commands take long on a 2-core machine (one to three minutes each, several
# processes that each compile): CI runs them on one stack (the single_stack marker in
# pyproject.toml). The others (server, scheduler API, the deviceless compile) and the flag and
# link checks run on every stack.
SLOW_PAGES = {"README.md", "docs/batch-job.md", "docs/states-and-scale-out.md", "docs/models.md",
              "docs/benchmarks.md"}


@dataclass
class Block:
    lang: str        # bash, console, python, text, ...
    flags: set       # the info string's other words: server, norun
    lines: list      # commands (bash/console) or the source lines (python)
    line_no: int     # of the opening fence, 1-based


def parse_blocks(text: str) -> list[Block]:
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = re.match(r"^(\s*)(```+|~~~+)\s*(.*)$", lines[i])
        if not m:
            i += 1
            continue
        fence, info, start = m.group(2), m.group(3).split(), i
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        lang = info[0].lower() if info else ""
        blocks.append(Block(lang, set(info[1:]), commands(lang, body) if lang in COMMAND_LANGS else body,
                            start + 1))
    return blocks


def commands(lang: str, body: list[str]) -> list[str]:
    """The commands of a bash/console block: continuations joined, comments and blanks dropped."""
    out, pending = [], ""
    for raw in body:
        line = raw.rstrip()
        if not pending:
            if lang == "console":
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            if not line.strip() or line.lstrip().startswith("#"):
                continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append((pending + line).strip())
        pending = ""
    if pending:
        out.append(pending.strip())
    return out


def page_blocks(page: Path) -> list[Block]:
    return parse_blocks(page.read_text())


# -- environment ------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def doc_env(tmp_path_factory) -> dict:
    plugin = os.environ.get("RWKV7_CUDA_PLUGIN_DIR") or str(REPO / ".venv" / "cuda-plugin")
    env = dict(os.environ, REPO=str(REPO), PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu",
               PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", RWKV7_CUDA_PLUGIN_DIR=plugin,
               XDG_CACHE_HOME=str(tmp_path_factory.mktemp("doc-cache")), TQDM_DISABLE="1",
               PYTHONUNBUFFERED="1")
    env.pop("XLA_FLAGS", None)
    return env


def workdir(tmp_path: Path) -> Path:
    """A fresh directory that looks like the repository root (symlinks to its entries)."""
    work = tmp_path / "work"
    work.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in {".git"} and not entry.name.startswith(".venv"):
            (work / entry.name).symlink_to(entry)
    return work


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def with_port(text: str, port: int | None) -> str:
    if port is None:
        return text
    return re.sub(r"(127\.0\.0\.1|localhost):8000\b", f"127.0.0.1:{port}", text)


def run_command(cmd: str, cwd: Path, env: dict, where: str) -> None:
    start = time.monotonic()
    try:
        r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=cwd, env=env, capture_output=True,
                           text=True, timeout=COMMAND_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{where}: timed out after {COMMAND_TIMEOUT} s: {cmd}")
    assert r.returncode == 0, (f"{where}: exit {r.returncode}: {cmd}\n--- stdout\n{r.stdout[-3000:]}"
                               f"\n--- stderr\n{r.stderr[-3000:]}")
    print(f"{time.monotonic() - start:6.1f} s  {where}: {cmd[:100]}")


class Server:
    """A ``bash server`` command in the background, on a free port."""

    def __init__(self, cmd: str, cwd: Path, env: dict, where: str):
        words = shlex.split(cmd, comments=True)
        self.port = free_port()
        if "--port" in words:
            words[words.index("--port") + 1] = str(self.port)
        else:
            words += ["--port", str(self.port)]
        self.log = cwd / f"server-{self.port}.log"
        self.where = where
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(["bash", "-c", "exec " + shlex.join(words)], cwd=cwd, env=env,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        end = time.monotonic() + HEALTH_TIMEOUT
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                pytest.fail(f"{self.where}: server exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        pytest.fail(f"{self.where}: /health not 200 after {HEALTH_TIMEOUT} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


# -- running the pages ------------------------------------------------------------------------

def _page_params():
    for page, pid in zip(PAGES, PAGE_IDS):
        marks = [pytest.mark.single_stack] if pid in SLOW_PAGES else []
        yield pytest.param(page, id=pid, marks=marks)


@pytest.mark.parametrize("page", list(_page_params()))
def test_page_commands(page: Path, tmp_path: Path, doc_env: dict):
    blocks = [b for b in page_blocks(page)
              if "norun" not in b.flags and (b.lang in COMMAND_LANGS or b.lang == "python")]
    if not blocks:
        pytest.skip("no runnable commands")
    cwd = workdir(tmp_path)
    server: Server | None = None
    name = page.relative_to(REPO)
    try:
        for n, block in enumerate(blocks):
            where = f"{name}:{block.line_no}"
            port = server.port if server else None
            if block.lang == "python":
                script = cwd / f"doc_block_{n}.py"
                script.write_text(with_port("\n".join(block.lines), port) + "\n")
                run_command(shlex.join([sys.executable, script.name]), cwd, doc_env, where)
            elif "server" in block.flags:
                assert len(block.lines) == 1 and server is None, f"{where}: one server command per page"
                server = Server(block.lines[0], cwd, doc_env, where)
            else:
                for cmd in block.lines:
                    run_command(with_port(cmd, port), cwd, doc_env, where)
    finally:
        if server is not None:
            server.stop()


# -- commands that are shown but not run --------------------------------------------------------

FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
MODULE_COMMANDS = {"scheduler", "rwkv7_apps.serve", "rwkv7_apps.tools.serving_bench"}


def command_words(cmd: str) -> list[str]:
    """``cmd`` split like the shell, comments and leading ``VAR=value`` assignments dropped."""
    try:
        words = shlex.split(cmd, comments=True)
    except ValueError:
        return []
    while words and ENV_ASSIGNMENT.match(words[0]):
        words = words[1:]
    return words


def script_of(cmd: str) -> list[str] | None:
    """The argv that prints the help of the project script ``cmd`` calls, or None."""
    words = command_words(cmd)
    if not words:
        return None
    prog = Path(words[0]).name
    if prog.startswith("rwkv7-"):
        return [str(BIN / prog)]
    if re.fullmatch(r"python(3(\.\d+)?)?", prog) and len(words) > 1:
        if words[1] == "-m" and len(words) > 2 and words[2] in MODULE_COMMANDS:
            return [sys.executable, "-m", words[2]]
        if re.fullmatch(r"(benchmarks|tools)/\w+\.py", words[1]):
            return [sys.executable, str(REPO / words[1])]
    return None


@functools.lru_cache(maxsize=None)
def help_text(argv: tuple) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
    r = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert r.returncode == 0, f"{argv} --help: exit {r.returncode}\n{r.stderr[-2000:]}"
    return r.stdout


def make_targets_check(cmd: str) -> str | None:
    words = shlex.split(cmd, comments=True)
    if not words or words[0] != "make":
        return None
    targets = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    r = subprocess.run(["make", "-n", "-C", str(REPO), *targets], capture_output=True, text=True, timeout=60)
    return None if r.returncode == 0 else f"make {' '.join(targets)}: {r.stderr.strip()[-500:]}"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_shown_commands_use_existing_flags(page: Path):
    """Every command (run or not) that calls a project script uses only flags its --help lists."""
    problems, checked = [], 0
    for block in page_blocks(page):
        if block.lang == "python" and "norun" in block.flags:
            compile("\n".join(block.lines), f"{page.name}:{block.line_no}", "exec")
        if block.lang not in COMMAND_LANGS:
            continue
        for cmd in block.lines:
            where = f"{page.relative_to(REPO)}:{block.line_no}"
            if "norun" in block.flags and (bad := make_targets_check(cmd)):
                problems.append(f"{where}: {bad}")
            argv = script_of(cmd)
            if argv is None:
                continue
            checked += 1
            text = help_text(tuple(argv))
            missing = [f for f in FLAG.findall(" ".join(command_words(cmd)))
                       if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", text)]
            if missing:
                problems.append(f"{where}: {Path(argv[-1]).name} has no {', '.join(missing)}: {cmd}")
    assert not problems, "\n".join(problems)


# -- size and links -----------------------------------------------------------------------------

def test_readme_fits_on_a_screen():
    size = (REPO / "README.md").stat().st_size
    assert size <= README_LIMIT, f"README.md is {size} bytes; move detail into docs/ (limit {README_LIMIT})"


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[`*]|\[|\]\([^)]*\)", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*$", text, flags=re.M)}


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_relative_links_resolve(page: Path):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    problems = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            problems.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{target}: no heading #{anchor} in {dest.relative_to(REPO)}")
    assert not problems, f"{page.relative_to(REPO)}: " + "; ".join(problems)


def test_parser_conventions():
    text = ("```bash\n# comment\nrwkv7-generate --a 1 \\\n    --b 2\n\necho hi\n```\n"
            "```console\n$ ls\noutput line\n```\n```bash server\nrwkv7-serve\n```\n"
            "```python norun\nx = 1\n```\n```text\nnot a command\n```\n")
    blocks = parse_blocks(text)
    assert [(b.lang, b.flags) for b in blocks] == [("bash", set()), ("console", set()), ("bash", {"server"}),
                                                   ("python", {"norun"}), ("text", set())]
    assert blocks[0].lines == ["rwkv7-generate --a 1      --b 2", "echo hi"]
    assert blocks[1].lines == ["ls"]
    assert script_of("XLA_FLAGS=x rwkv7-generate --model m") == [str(BIN / "rwkv7-generate")]
    assert script_of("PYTHONPATH=. python3 benchmarks/gpu_check.py --out d")[-1].endswith("benchmarks/gpu_check.py")
    assert script_of("ray start --head") is None
    assert FLAG.findall(" ".join(command_words("XLA_FLAGS=--x=2 rwkv7-generate --model m --state a=b  # --c"))) \
        == ["--model", "--state"]
    assert slug("The batch job: `rwkv7-generate`") == "the-batch-job-rwkv7-generate"
    assert slug("States, prefix cache, faults") == "states-prefix-cache-faults"
    assert slug("The torch reference (`rwkv_torch_ref`)") == "the-torch-reference-rwkv_torch_ref"
