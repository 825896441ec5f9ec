#!/bin/sh
# The board checks: install the release wheel as a user would, check the kernel variant it picks against the
# CPU, run the test suite natively, run the board benchmark. The CI job on the hosted SpacemiT K1 runners runs
# exactly this; so can anyone on a riscv64 board (docs/board.md).
#
#   ci/board/run-board-checks.sh --wheel=dist                # on Debian trixie: apt, venv, pip, tests, benchmark
#   ci/board/run-board-checks.sh --container --wheel=dist    # any distribution with Docker: the same in debian:trixie
#   ci/board/run-board-checks.sh --no-apt --installed ...    # skip apt and the venv: this Python's rvv_attn
#
# This file only gets Debian's Python and torch (the wheel has libraries for trixie's python3-torch 2.6 and
# forky's 2.14: RVV_ATTN_BOARD_IMAGE=debian:forky runs the checks against the latter) or a container that
# has them; everything else is ci/board/board_checks.py (options: --help).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
apt=1
container=0
for arg in "$@"; do
    case "$arg" in
        --no-apt) apt=0 ;;
        --container) container=1 ;;
    esac
done

if [ "$container" = 1 ] && [ -z "${RVV_ATTN_BOARD_IN_CONTAINER:-}" ]; then
    # The checkout is mounted at /src; the venv stays inside the container, results land in build/results/board.
    exec docker run --rm -e RVV_ATTN_BOARD_IN_CONTAINER=1 -v "$root:/src" -w /src "${RVV_ATTN_BOARD_IMAGE:-debian:trixie}" \
        ci/board/run-board-checks.sh --venv=/tmp/board-venv "$@"
fi

if [ "$apt" = 1 ]; then
    if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update
    # Debian's torch (a line the wheel has a library for); pytest and hypothesis for the suite (the
    # versions the emulated runs of the same Debian release use).
    $sudo apt-get install -y --no-install-recommends \
        python3 python3-venv python3-pip python3-torch python3-numpy python3-pytest python3-hypothesis
fi

exec python3 "$here/board_checks.py" "$@"
