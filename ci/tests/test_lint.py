"""The lint session's checks (ci/driver/lint.py): the docs' relative links, and how the tool checks report."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from driver import lint
from driver.errors import ConfigError, DriverError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "heading, anchor",
    [
        ("Benchmarks: instruction counts", "benchmarks-instruction-counts"),
        ("`nox -s bench` and `--only`", "nox--s-bench-and---only"),
        ("Performance (instruction counts)", "performance-instruction-counts"),
        ("The [guard](#guard) itself", "the-guard-itself"),
        ("VLEN 128 / 256", "vlen-128--256"),
    ],
)
def test_slugs_follow_githubs_rules(heading, anchor):
    assert lint.slug(heading) == anchor


def test_anchors_number_repeated_headings_and_skip_code():
    text = '# Usage\n## Usage\n```sh\n# not a heading\n```\n<a name="custom"></a>\n### Usage #\n'
    assert lint.anchors(text) == {"usage", "usage-1", "usage-2", "custom"}


def test_links_are_found_outside_code_only():
    text = (
        'See [a](docs/a.md#x) and ![plot](../bench/results/bench.png "title").\n'
        "`[not](a/link.md)` and [ext](https://example.org/x.md)\n"
        "```\n[inside](fence.md)\n```\n"
        "[ref]: docs/b.md\n"
    )
    assert list(lint.links(text)) == [
        (1, "docs/a.md#x"),
        (1, "../bench/results/bench.png"),
        (2, "https://example.org/x.md"),
        (6, "docs/b.md"),
    ]


def test_broken_links_name_the_page_line_and_what_is_missing(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n## Set-up steps\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/guide.md#set-up-steps) [self](#readme) [web](https://x.invalid/none.md)\n"
        "# Readme\n"
        "[gone](docs/missing.md) [bad anchor](docs/guide.md#setup)\n"
        "[folder](docs/)\n"
    )
    (tmp_path / "docs" / "back.md").write_text("[up](../README.md#readme) [no](../README.md#nope)\n")
    problems = lint.broken_links(tmp_path, lint.doc_files(tmp_path))
    assert problems == [
        "README.md:3: docs/missing.md: no such file",
        "README.md:3: docs/guide.md#setup: no heading with anchor #setup in guide.md",
        "docs/back.md:1: ../README.md#nope: no heading with anchor #nope in README.md",
    ]


def test_the_projects_docs_have_no_broken_relative_links():
    assert lint.broken_links(ROOT, lint.doc_files(ROOT)) == []


def _tool(folder: Path, name: str, code: int) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\necho {name} says $*\nexit {code}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_every_check_runs_and_the_failures_are_reported_together(tmp_path, monkeypatch):
    venv = tmp_path / "bin"
    venv.mkdir()
    _tool(venv, "ruff", 1)
    _tool(venv, "actionlint", 0)
    _tool(venv, lint.CLANG_FORMAT, 0)
    monkeypatch.setenv("PATH", f"{venv}:/usr/bin:/bin")
    (tmp_path / "README.md").write_text("[gone](nowhere.md)\n")
    lines: list[str] = []
    with pytest.raises(DriverError) as err:
        lint.run_all(tmp_path, venv, report=lines.append)
    message = str(err.value)
    assert "ruff check (exit code 1; fix: ruff check --fix" in message and "ruff format (exit code 1" in message
    assert "clang-format: no .clang-format in" in message and "actionlint" not in message
    assert "relative links (1 broken, listed above)" in message and "README.md:1: nowhere.md: no such file" in lines
    (tmp_path / ".clang-format").write_text("BasedOnStyle: LLVM\n")
    _tool(venv, "ruff", 0)
    (tmp_path / "README.md").write_text("fine\n")
    lint.run_all(tmp_path, venv, report=lines.append)
    assert "clean" in lines[-1]


def test_clang_format_needs_the_projects_style_file(tmp_path):
    with pytest.raises(ConfigError, match="no .clang-format"):
        lint.require_clang_format_config(tmp_path)


def test_clang_format_covers_the_kernels_and_the_plugin():
    sources = {p.relative_to(ROOT).parts[0] + "/" for p in lint.c_sources(ROOT)}
    assert sources == {"csrc/", "bench/"}
    assert all(p.suffix in lint.C_SUFFIXES for p in lint.c_sources(ROOT))
