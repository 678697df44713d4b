"""The fenced code blocks of README.md and docs/*.md, with their ``docs-test`` directives.

A directive is an HTML comment (invisible on GitHub) on the line right above a fence:

    <!-- docs-test: skip needs a Docker engine -->
    <!-- docs-test: limit 20 -->

docs/architecture.md ("Documentation is tested") lists the directives; tests/test_docs.py
runs the blocks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^(?P<indent> {0,3})```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^ {0,3}```[ \t]*$",
                   re.S | re.M)  # fmt: skip
DIRECTIVE = re.compile(r"<!--\s*docs-test:\s*(?P<text>.*?)\s*-->", re.S)
KNOWN = {"skip", "slow", "limit", "synopsis", "alternatives", "setup", "requires"}


@dataclass
class Block:
    path: Path
    line: int
    lang: str
    body: str
    directives: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def parse_directives(text: str) -> dict[str, str]:
    """``limit 20; skip: a reason`` -> {"limit": "20", "skip": "a reason"}: ``;`` separates
    directives, except that ``skip`` and ``setup`` take the rest of the comment (a reason or
    code may hold ``;``), so they come last."""
    found = {}
    parts = [p.strip() for p in text.split(";")]
    for i, part in enumerate(parts):
        if not part:
            continue
        name, _, value = part.partition(" ")
        name = name.rstrip(":")
        if name in ("skip", "setup"):
            found[name] = "; ".join([value.strip(), *parts[i + 1 :]]).strip("; ")
            break
        found[name] = value.strip()
    return found


def blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        directives = {}
        if before.strip().endswith("-->"):
            start = text.rfind("<!--", 0, match.start())
            comment = DIRECTIVE.search(text, start, match.start())
            if comment:
                directives = parse_directives(comment.group("text"))
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(path, line, match.group("lang"), match.group("body"), directives))
    return found


def all_blocks() -> list[Block]:
    return [b for path in doc_files() for b in blocks(path)]


def outside_fences(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of every line not inside a fenced block."""
    text = path.read_text(encoding="utf-8")
    inside = set()
    for match in FENCE.finditer(text):
        first = text.count("\n", 0, match.start())
        inside.update(range(first, text.count("\n", 0, match.end()) + 1))
    return [(i + 1, line) for i, line in enumerate(text.split("\n")) if i not in inside]


def shell_commands(body: str) -> list[str]:
    """The block's commands: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    commands = []
    for line in joined.split("\n"):
        line = re.sub(r"(^|\s)#(?=[^'\"]*$).*", "", line).strip()  # a comment outside quotes
        if line:
            commands.append(line)
    return commands


def with_limit(command: str, limit: str) -> str:
    """``aisafety evaluate|compare ...`` with ``--limit N`` added (each one in a ``&&`` chain)."""
    return re.sub(
        r"\baisafety (evaluate|compare)\b([^&|;]*)",
        lambda m: f"aisafety {m.group(1)}{m.group(2).rstrip()} --limit {limit} ",
        command,
    ).strip()
