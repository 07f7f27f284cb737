"""Run the code blocks of one Markdown page, in order, and report each block's result.

    uv run python tests-integration/docs_runner.py docs/guides/data.md
    uv run python tests-integration/docs_runner.py README.md --json report.json

Started from the repository root, it runs the blocks in a fresh temporary folder that holds
a copy of `examples/` (printed first; `--workdir` chooses another), so nothing a page writes
lands in the checkout. `tests-integration/test_docs_examples.py` runs this once per page, in a subprocess of its
own (so a page pays for its torch/jax imports once, and pages run in parallel), in a fresh
temporary working directory that holds a copy of `examples/`.

What runs:

- `python` blocks run in one namespace per page, top to bottom, so a later block sees the
  names an earlier one defined. A block written as a `>>>` session runs as a doctest.
- `bash`/`sh`/`console` blocks whose commands are all `pipekit-train ...` (optionally
  `uv run pipekit-train ...` or `python -m pipekit_train.core.cli ...`) run, each command
  in a shell, and must exit 0 (or the status named by an `exit` directive).
- `toml`, `json` and `yaml` blocks are parsed.
- `text` blocks are shown, not run, unless an `output` directive says they are the
  printed output of the block before them (or, when their lines start with `$ `, a
  console session whose commands run and whose output is compared). Output is compared
  like a doctest with ELLIPSIS and NORMALIZE_WHITESPACE: `...` matches anything and line
  wrapping does not matter.
- A fenced block without a language is an error: say what it is (`text`, `python`, ...).

Directives are HTML comments (invisible on the site) on the lines directly above a
fenced block:

- `<!-- docs: skip (reason) -->` skips the block; the reason is required and reported.
- `<!-- docs: output -->` marks a `text` block as the expected output (see above).
- `<!-- docs: replace OLD => NEW -->` runs the next block with `OLD` replaced by `NEW`
  (e.g. a smaller `max_steps`; the page shows the real value).
- `<!-- docs: exit N -->` the next shell block's commands exit with status `N`.
- `<!-- docs: file PATH -->` writes the next block to `PATH` (relative to the working
  directory, which goes on `sys.path` and `PYTHONPATH`) instead of running it: the module
  a later block imports by name, as `# my_project/trials.py` blocks say.
- `<!-- docs: env NAME=VALUE -->` sets an environment variable for the rest of the page.
- `<!-- docs: setup` ... `-->` (a multi-line comment, anywhere) is Python run at that
  point in the page's namespace: the data or names a snippet assumes the reader has.
"""

from __future__ import annotations

import argparse
import contextlib
import doctest
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import traceback
from dataclasses import dataclass, field
from pathlib import Path

FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,})(?P<lang>[^\s`]*)\s*$")
DIRECTIVE = re.compile(r"^\s*<!--\s*docs:\s*(?P<kind>[a-z]+)(?P<arg>.*?)\s*-->\s*$")
SETUP_START = re.compile(r"^\s*<!--\s*docs:\s*setup\s*$")
SHELL = {"bash", "sh", "shell", "console"}
SHOWN = {"text", "txt", "output"}
PARSED = {"toml", "json", "yaml"}
KNOWN = {"python", "py"} | SHELL | SHOWN | PARSED
CLI_PREFIXES = ("pipekit-train ", "python -m pipekit_train.core.cli ")
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


@dataclass
class Block:
    """One fenced block (or a hidden `setup` comment) of a page."""

    line: int
    lang: str
    code: str
    skip: str | None = None
    output: bool = False
    exit: int = 0
    replace: list[tuple[str, str]] = field(default_factory=list)
    file: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def _dedent(lines: list[str], indent: str) -> str:
    return "\n".join(x[len(indent) :] if x.startswith(indent) else x.lstrip() for x in lines)


def parse(text: str) -> list[Block]:
    """The page's blocks with their directives, in page order."""
    lines = text.splitlines()
    blocks: list[Block] = []
    pending: list[tuple[int, str, str]] = []  # directives waiting for their block
    i = 0
    while i < len(lines):
        line = lines[i]
        if SETUP_START.match(line):
            j = i + 1
            while j < len(lines) and "-->" not in lines[j]:
                j += 1
            blocks.append(Block(i + 1, "setup", "\n".join(lines[i + 1 : j])))
            i = j + 1
            continue
        d = DIRECTIVE.match(line)
        if d:
            pending.append((i + 1, d["kind"], d["arg"].strip()))
            i += 1
            continue
        f = FENCE.match(line)
        if f:
            close = re.compile(r"^\s*" + f["fence"] + r"\s*$")
            j = i + 1
            while j < len(lines) and not close.match(lines[j]):
                j += 1
            block = Block(i + 1, f["lang"].lower(), _dedent(lines[i + 1 : j], f["indent"]))
            _apply(block, pending)
            pending = []
            blocks.append(block)
            i = j + 1
            continue
        if line.strip() and pending:  # a directive must sit directly above its block
            for n, kind, _ in pending:
                if kind != "env":
                    blocks.append(_orphan(n, kind))
                else:
                    blocks.append(Block(n, "env", "", env=dict([_env(_)])))
            pending = []
        i += 1
    for n, kind, arg in pending:
        blocks.append(
            Block(n, "env", "", env=dict([_env(arg)])) if kind == "env" else _orphan(n, kind)
        )
    return blocks


def _orphan(line: int, kind: str) -> Block:
    b = Block(line, "directive", "")
    b.errors.append(f"`docs: {kind}` is not directly above a fenced block")
    return b


def _env(arg: str) -> tuple[str, str]:
    name, _, value = arg.partition("=")
    return name.strip(), value.strip()


def _apply(block: Block, directives: list[tuple[int, str, str]]) -> None:
    for _, kind, arg in directives:
        if kind == "skip":
            reason = re.fullmatch(r"\((.+)\)", arg)
            if not reason or not reason[1].strip():
                block.errors.append("`docs: skip` needs a reason: <!-- docs: skip (why) -->")
            else:
                block.skip = reason[1].strip()
        elif kind == "output":
            block.output = True
        elif kind == "exit":
            block.exit = int(arg)
        elif kind == "replace":
            old, sep, new = arg.partition("=>")
            if not sep:
                block.errors.append("`docs: replace` is written OLD => NEW")
            block.replace.append((old.strip(), new.strip()))
        elif kind == "env":
            block.env.update([_env(arg)])
        elif kind == "file":
            block.file = arg
        else:
            block.errors.append(f"unknown directive `docs: {kind}`")


def _shell_commands(code: str) -> list[str]:
    """The block's commands: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    commands = []
    for raw in joined.splitlines():
        line = raw.strip().removeprefix("$ ")
        if not line or line.startswith("#"):
            continue
        commands.append(re.sub(r"\s+#.*$", "", line))
    return commands


def _cli_command(command: str) -> str | None:
    command = command.removeprefix("uv run ")
    return command if command.startswith(CLI_PREFIXES) else None


def _console(code: str) -> list[tuple[str, str]]:
    """A `$ command` session: each command with the output shown under it."""
    session: list[tuple[str, list[str]]] = []
    for line in code.splitlines():
        if line.startswith("$ "):
            session.append((line[2:], []))
        elif session:
            session[-1][1].append(line)
    return [(cmd, "\n".join(out)) for cmd, out in session]


def _matches(want: str, got: str) -> bool:
    want = want.strip() + "\n"
    got = got.strip() + "\n"
    return doctest.OutputChecker().check_output(want, got, FLAGS)


class Page:
    """Runs one page's blocks in order, in the current working directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # `__main__`, so a page's `if __name__ == "__main__":` script runs.
        self.namespace: dict[str, object] = {"__name__": "__main__"}
        self.last_output: str | None = None

    def run(self, block: Block) -> dict[str, object]:
        code = block.code
        for old, new in block.replace:
            if old not in code:
                return {"status": "fail", "error": f"`docs: replace` found no {old!r}"}
            code = code.replace(old, new)
        if block.file is not None:
            return self._file(block, code)
        if block.lang in ("python", "py", "setup"):
            if code.lstrip().startswith(">>>"):
                return self._doctest(block, code)
            return self._python(block, code)
        if block.lang in SHELL:
            return self._shell(block, code)
        if block.lang == "toml":
            tomllib.loads(code)
            return {"status": "parsed"}
        if block.lang == "yaml":
            import yaml  # PyYAML comes with mkdocs (the dev group)

            yaml.safe_load(code)
            return {"status": "parsed"}
        if block.lang == "json":
            value = json.loads(code)
            if block.output:
                if self.last_output is None or json.loads(self.last_output) != value:
                    return {
                        "status": "fail",
                        "error": _diff("the block above", code, str(self.last_output)),
                    }
                return {"status": "compared"}
            return {"status": "parsed"}
        if block.lang in SHOWN:
            return self._shown(block, code)
        return {"status": "shown"}

    def _file(self, block: Block, code: str) -> dict[str, object]:
        """Write the block to a file (a module a later block imports by name)."""
        path = Path(block.file or "")
        if path.is_absolute() or ".." in path.parts:
            return {"status": "fail", "error": f"`docs: file` needs a relative path: {path}"}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code + "\n", encoding="utf-8")
        here = os.getcwd()
        if here not in sys.path:
            sys.path.insert(0, here)  # and for spawned workers and child processes:
            os.environ["PYTHONPATH"] = os.pathsep.join(
                filter(None, [here, os.environ.get("PYTHONPATH")])
            )
        if block.lang in ("python", "py"):
            compile(code, str(path), "exec")
        return {"status": "written", "file": str(path)}

    def _python(self, block: Block, code: str) -> dict[str, object]:
        buffer = io.StringIO()
        # Padded so that a traceback names the line of the page.
        compiled = compile("\n" * block.line + code, str(self.path), "exec")
        with contextlib.redirect_stdout(buffer):
            exec(compiled, self.namespace)
        self.last_output = buffer.getvalue()
        return {"status": "ran", "stdout": self.last_output[-2000:]}

    def _doctest(self, block: Block, code: str) -> dict[str, object]:
        parser = doctest.DocTestParser()
        test = parser.get_doctest(code, self.namespace, str(self.path), str(self.path), block.line)
        report: list[str] = []
        runner = doctest.DocTestRunner(optionflags=FLAGS)
        runner.run(test, out=report.append, clear_globs=False)
        if runner.failures:
            return {"status": "fail", "error": "".join(report)}
        return {"status": "ran"}

    def _run_command(self, command: str) -> subprocess.CompletedProcess[str]:
        command = command.removeprefix("uv run ")
        if command.startswith("python "):
            command = shlex.quote(sys.executable) + command[len("python") :]
        env = {**os.environ}
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        return subprocess.run(
            command, shell=True, capture_output=True, text=True, timeout=600, env=env
        )

    def _shell(self, block: Block, code: str) -> dict[str, object]:
        commands = _shell_commands(code)
        not_cli = [c for c in commands if _cli_command(c) is None]
        if not_cli:
            return {
                "status": "fail",
                "error": f"shell commands that are not `pipekit-train`: {not_cli}; run them "
                "or mark the block <!-- docs: skip (reason) -->",
                "structural": True,
            }
        outputs = []
        for command in commands:
            proc = self._run_command(command)
            outputs.append(proc.stdout + proc.stderr)
            if proc.returncode != block.exit:
                return {
                    "status": "fail",
                    "error": f"`{command}` exited {proc.returncode} (expected {block.exit}):\n"
                    + (proc.stdout + proc.stderr)[-3000:],
                }
        self.last_output = "".join(outputs)
        return {"status": "ran", "commands": commands}

    def _shown(self, block: Block, code: str) -> dict[str, object]:
        if not block.output:
            return {"status": "shown"}
        session = _console(code)
        if session:
            for command, want in session:
                if _cli_command(command) is None:
                    return {"status": "fail", "error": f"not a pipekit-train command: {command}"}
                proc = self._run_command(command)
                got = proc.stdout + proc.stderr
                if not _matches(want, got):
                    return {"status": "fail", "error": _diff(command, want, got)}
            return {"status": "compared"}
        if self.last_output is None:
            return {"status": "fail", "error": "`docs: output` follows no block that ran"}
        if not _matches(code, self.last_output):
            return {"status": "fail", "error": _diff("the block above", code, self.last_output)}
        return {"status": "compared"}


def _diff(what: str, want: str, got: str) -> str:
    return (
        f"the output of {what} differs from the page.\nThe page shows:\n{want}\nIt printed:\n{got}"
    )


def run_page(path: Path) -> list[dict[str, object]]:
    """Run every block of the page at `path` (in the current directory); one result each."""
    page = Page(path)
    results: list[dict[str, object]] = []
    failed = False
    for block in parse(path.read_text(encoding="utf-8")):
        result: dict[str, object] = {"line": block.line, "lang": block.lang}
        os.environ.update(block.env)
        t0 = time.perf_counter()
        if block.errors:
            result |= {"status": "fail", "error": "; ".join(block.errors)}
        elif block.lang == "":
            result |= {
                "status": "fail",
                "error": "a fenced block needs a language (python, bash, text, toml, json...)",
            }
        elif block.lang not in KNOWN | {"setup", "env"}:
            result |= {"status": "fail", "error": f"unknown block language {block.lang!r}"}
        elif block.skip is not None:
            result |= {"status": "skipped", "reason": block.skip}
        elif failed and block.lang not in PARSED:
            result |= {"status": "not run", "reason": "an earlier block of the page failed"}
        elif block.lang == "env":
            result |= {"status": "env"}
        else:
            try:
                result |= page.run(block)
            except BaseException:  # noqa: BLE001 - reported, not raised
                result |= {"status": "fail", "error": traceback.format_exc(limit=-6)}
        result["seconds"] = round(time.perf_counter() - t0, 2)
        ran = block.lang in {"python", "py", "setup"} | SHELL or block.output
        failed = failed or (ran and result["status"] == "fail" and not result.get("structural"))
        result.pop("structural", None)
        results.append(result)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path)
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    parser.add_argument(
        "--workdir",
        type=Path,
        help="run the blocks in this folder (default: the current one; started from the "
        "repository root, a fresh temporary folder holding a copy of examples/, so that "
        "the pages' outputs never land in the checkout)",
    )
    args = parser.parse_args()
    page = args.page.resolve()
    report = args.json.resolve() if args.json else None
    root = Path(__file__).resolve().parents[1]
    workdir = args.workdir
    if workdir is None and Path.cwd().resolve() == root:
        workdir = Path(tempfile.mkdtemp(prefix="pipekit-docs-"))
        shutil.copytree(
            root / "examples", workdir / "examples", ignore=shutil.ignore_patterns("out")
        )
        print(f"running in {workdir} (a copy of examples/ is there)", file=sys.stderr)
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
        os.chdir(workdir)
    results = run_page(page)
    for r in results:
        extra = r.get("reason") or r.get("error") or ""
        print(f"{page.name}:{r['line']} [{r['lang']}] {r['status']} ({r['seconds']} s) {extra}")
    if report is not None:
        report.write_text(json.dumps(results, indent=1))
    sys.exit(1 if any(r["status"] == "fail" for r in results) else 0)


if __name__ == "__main__":
    main()
