"""Every command README.md and docs/*.md show is one the tools accept (no Spark, no store, nothing run).

- A `kcompact ...` command in a shell code block (```bash, ```sh, ```shell, ```console), including
  `.venv/bin/kcompact`, `$KC` and the spark-submit entry points `jobs/<name>.py` that hand their flags to the CLI,
  is parsed by the CLI's own argparse parser (`compaction.cli.build_parser`) as written: the command and its
  sub-command exist, every option is one of theirs, each gets the number of values it takes, and the required ones
  are there. Values are not converted (`--partition N` is fine): a page may show placeholders. A synopsis such as
  `[--after VERSION]` or `[--master URL | --reference]` is read with its optional parts in (the first alternative).
- A `kcompact ...` in inline code (`` `kcompact verify --config C` ``) names an existing command, and each
  `--option` it names is one of that command's.
- Every `make <target>` in a shell block or inline code is a target of the Makefile.

A typo'd option or target in the docs fails here, naming the file, the line and the command.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from compaction.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_BLOCKS = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^```(\S*)\s*$")
JOBS = {"compact": ["compact"], "gc": ["gc"], "plan": ["plan"], "verify": ["verify"], "table": ["table"],
        "wal_roll": ["wal", "roll"]}
"""The spark-submit entry points that run the CLI (`jobs/<name>.py`: `run([*command, *sys.argv[1:]])`).
`jobs/read_partition.py` has a parser of its own and is not checked here."""
SEPARATORS = {"|", "||", "&", "&&", ";", "(", ")", "$(", "<", ">", ">>", "2>", "2>&1", "&>"}


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    words: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {shlex.join(self.words)}"


def _markdown(path: Path) -> Iterator[tuple[int, str, str | None]]:
    """(line number, line, the fenced block's language or None outside a block)."""
    language: str | None = None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fence = FENCE.match(line)
        if fence:
            language = None if language is not None else fence.group(1)
            continue
        yield number, line, language


def _shell_lines(path: Path) -> Iterator[tuple[int, str]]:
    """The logical lines of the page's shell blocks: `\\`-continued lines joined, numbered by their first."""
    pending, start = "", 0
    for number, line, language in _markdown(path):
        if language not in SHELL_BLOCKS:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield start, pending + line
        pending = ""


def _inline_spans(path: Path) -> Iterator[tuple[int, str]]:
    for number, line, language in _markdown(path):
        if language is None:
            for span in re.findall(r"`([^`\n]+)`", line):
                yield number, span


def _words(line: str) -> list[str]:
    """The shell words of a line, with `|`, `&&`, `;`, redirections and parentheses as words of their own; a
    comment dropped. A quoted word (`"$(python3 -c '...')"`) stays one word."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def _commands(words: list[str]) -> Iterator[list[str]]:
    """The simple commands of a line, split at the shell's separators."""
    current: list[str] = []
    for word in words:
        if word in SEPARATORS or set(word) <= set("|&;()<>"):
            if current:
                yield current
            current = []
        else:
            current.append(word)
    if current:
        yield current


def _is_kcompact(word: str) -> bool:
    return word == "kcompact" or word.endswith("/kcompact") or word == "$KC"


def _cli_words(command: list[str]) -> list[str] | None:
    """The CLI's arguments of a simple command, or None when it runs neither kcompact nor a jobs/ entry point."""
    while command and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", command[0]):  # VAR=value before the command
        command = command[1:]
    if command and _is_kcompact(command[0]):
        return command[1:]
    for i, word in enumerate(command):
        job = re.fullmatch(r"jobs/(\w+)\.py", word)
        if job and job.group(1) in JOBS:
            return [*JOBS[job.group(1)], *command[i + 1:]]
    return None


def _synopsis(words: list[str]) -> list[str]:
    """A usage line's words with its optional parts in: brackets dropped, the first of `a | b` alternatives kept."""
    out: list[str] = []
    skipping = False
    for word in words:
        closes = word.endswith("]")
        word = word.strip("[]")
        if word == "|":
            skipping = True
        elif word and not skipping and word != "...":
            out.append(word)
        if closes:
            skipping = False
    return out


def shell_commands() -> list[Command]:
    found = []
    for page in PAGES:
        for number, line in _shell_lines(page):
            for command in _commands(_words(line)):
                if command[0] == "make":
                    found.append(Command(page.relative_to(ROOT).as_posix(), number, tuple(command)))
                    continue
                words = _cli_words(command)
                if words is not None:
                    found.append(Command(page.relative_to(ROOT).as_posix(), number, ("kcompact", *words)))
    return found


def inline_commands() -> list[Command]:
    found = []
    for page in PAGES:
        for number, span in _inline_spans(page):
            if re.match(r"(\.venv/bin/)?kcompact |make ", span):
                try:
                    words = _words(span)
                except ValueError:  # an unbalanced quote in prose: not a command line
                    continue
                if words[0] != "make":
                    words = ["kcompact", *words[1:]]
                found.append(Command(page.relative_to(ROOT).as_posix(), number, tuple(words)))
    return found


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {t for line in re.findall(r"^([A-Za-z0-9_.\- ]+):(?!=)", text, re.M) for t in line.split()}


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _Refused(message)


def placeholder_parser() -> argparse.ArgumentParser:
    """The CLI's parser with every value taken as written (no `type`), erroring instead of exiting."""
    parser = build_parser()

    def loosen(p: argparse.ArgumentParser) -> None:
        p.__class__ = _Parser
        for action in p._actions:
            action.type = None
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    loosen(sub)

    loosen(parser)
    return parser


def _subparser(parser: argparse.ArgumentParser, words: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The (sub-)sub-parser the leading words name, and the words after them."""
    while words:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or words[0] not in subs[0].choices:
            break
        parser, words = subs[0].choices[words[0]], words[1:]
    return parser, words


def _named_commands(parser: argparse.ArgumentParser) -> set[str]:
    return {name for a in parser._actions if isinstance(a, argparse._SubParsersAction) for name in a.choices}


SHELL = shell_commands()
INLINE = inline_commands()
PARSER = placeholder_parser()
TARGETS = make_targets()


def test_the_pages_show_commands() -> None:
    """The extraction finds what the pages hold: the README's tour, the cluster's spark-submit lines, the WAL's."""
    kcompact = {c.words[1:3] for c in SHELL if c.words[0] == "kcompact"}
    assert {("generate", "--logdir"), ("verify", "--store"), ("wal", "upload"), ("wal", "roll")} <= kcompact
    assert any(c.page == "docs/operating.md" and c.words[1] == "verify" for c in SHELL)  # $SUBMIT jobs/verify.py
    assert {("make", "test"), ("make", "demo")} <= {c.words[:2] for c in SHELL}
    assert len(INLINE) > 20


@pytest.mark.parametrize("command", [c for c in SHELL if c.words[0] == "kcompact"], ids=str)
def test_a_shell_block_command_parses(command: Command) -> None:
    words = _synopsis(list(command.words[1:]))
    if "--help" in words or "-h" in words:
        words = [w for w in words if w not in ("--help", "-h")]
        _, rest = _subparser(PARSER, words)
        assert not rest, f"{command}: no such command"
        return
    try:
        PARSER.parse_args(words)
    except _Refused as e:
        pytest.fail(f"{command}: {e}")


@pytest.mark.parametrize("command", [c for c in INLINE if c.words[0] == "kcompact"], ids=str)
def test_an_inline_command_names_real_options(command: Command) -> None:
    words = _synopsis(list(command.words[1:]))
    if not words or words[0].isupper() or words[0] == "...":  # `kcompact COMMAND --help`, `kcompact ... --help`
        return
    if not words[0].startswith("-"):
        assert words[0] in _named_commands(PARSER), f"{command}: no command {words[0]!r}"
    parser, rest = _subparser(PARSER, words)
    options = set(parser._option_string_actions)
    unknown = [w.split("=")[0] for w in rest if w.startswith("-") and w.split("=")[0] not in options]
    assert not unknown, f"{command}: {unknown} not options of `{parser.prog}`"


@pytest.mark.parametrize("command", [c for c in SHELL + INLINE if c.words[0] == "make"], ids=str)
def test_a_make_target_exists(command: Command) -> None:
    targets = [w for w in command.words[1:] if "=" not in w and not w.startswith("-")]
    assert targets, f"{command}: no target"
    missing = [t for t in targets if t not in TARGETS]
    assert not missing, f"{command}: no such target in the Makefile: {missing}"


def test_a_typo_is_caught() -> None:
    """The checks above are real: a misspelt option, command or target fails them."""
    with pytest.raises(_Refused):
        PARSER.parse_args(["compact", "--store", "S", "--config", "F", "--report-jsn", "r.json"])
    with pytest.raises(_Refused):
        PARSER.parse_args(["verify", "--store", "S", "--topic", "T", "--partition", "N"])  # --before is required
    with pytest.raises(_Refused):
        PARSER.parse_args(["wal", "rol", "--store", "S"])
    assert "cluster-test" in TARGETS and "clustertest" not in TARGETS
    line = ".venv/bin/kcompact read --store ./s --topic t --partition 0 --isolation read_commited | head -3"
    (words,) = [_cli_words(c) for c in _commands(_words(line))][:1]
    assert words is not None
    with pytest.raises(_Refused):
        PARSER.parse_args(words)
