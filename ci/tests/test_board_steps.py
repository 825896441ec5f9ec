"""docs/sglang.md's board steps: read from the page, run as written, timed."""

from __future__ import annotations

import pytest

from driver.errors import ConfigError
from driver.sglang import board_steps, environment


@pytest.fixture(scope="module")
def blocks() -> dict[str, str]:
    return board_steps.doc_blocks(board_steps.DOC.read_text())


def test_the_page_marks_the_three_blocks(blocks):
    assert list(blocks) == list(board_steps.BLOCKS)
    assert "sglang serve" in blocks["serve"] or "sglang.launch_server" in blocks["serve"]
    assert "/generate" in blocks["request"]


def test_the_pages_apt_list_is_the_tables(blocks):
    """What a board installs is what the emulated target holds: the table's Debian packages, plus torch and venv."""
    listed = {w for w in blocks["install"].split() if w.startswith("python3-")}
    assert listed == {"python3-venv", "python3-torch", *environment.load().debian}


def test_the_script_holds_the_blocks_verbatim_and_waits_for_the_server(blocks):
    script = board_steps.guest_script(blocks, wait_seconds=60)
    assert blocks["install"] in script and blocks["request"] in script
    assert board_steps.serve_command(blocks["serve"]) in script
    assert script.index(blocks["install"]) < script.index("write_model.py") < script.index("/health")
    assert script.rstrip().endswith(f"grep -q output_ids {board_steps.HOME}/response.txt")
    # The server runs as a process group that goes with the script, however it ends.
    assert "setsid sh" in script and "trap 'kill -KILL -$server" in script
    assert script.index("trap 'kill -KILL") < script.index("/health")


def test_a_missing_or_doubled_block_is_an_error():
    page = "<!-- board-steps: install -->\n```sh\napt\n```\n<!-- board-steps: serve -->\n```sh\nserve\n```\n"
    with pytest.raises(ConfigError, match="no board-steps block for request"):
        board_steps.doc_blocks(page)
    twice = page + "<!-- board-steps: request -->\n```sh\ncurl\n```\n" * 2
    with pytest.raises(ConfigError, match="two 'request'"):
        board_steps.doc_blocks(twice)


def test_the_serve_block_must_stay_in_the_foreground():
    with pytest.raises(ConfigError, match="foreground"):
        board_steps.serve_command("sglang serve --model-path m &")
    assert board_steps.serve_command("# start\nsglang serve \\\n  --device cpu") == "sglang serve \\\n  --device cpu"


def test_step_times_are_read_from_the_output():
    out = "apt noise\nrvv-attn-step install 1200\nmore\nrvv-attn-step server-start 300\n"
    assert board_steps.parse_steps(out) == {"install": 1200, "server-start": 300}
