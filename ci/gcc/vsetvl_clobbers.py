#!/usr/bin/env python3
"""Find vsetvl instructions that GCC's RISC-V vsetvl pass inserted over a live register.

Reads the dump of ``g++ -fdump-rtl-vsetvl-details`` (GCC 14-16). For each ``Insert vsetvl insn N`` whose
instruction writes a general register (``vsetvli aK,zero,...``: a VLMAX request whose result the source
used), it follows the final RTL after insn N: if the next instruction to touch that register reads it as
another pseudo than the one the inserted vsetvl defines, the vsetvl has overwritten a value still in use,
which is GCC 14's fault (ci/gcc/gcc14_vsetvl_edge.cpp, docs/gcc.md). Prints one CLOBBER line per finding;
exits 0 if it found any, 1 if none.
"""

from __future__ import annotations

import re
import sys

INSERTED = re.compile(
    r"Insert vsetvl insn (\d+):\n\(insn \d+ 0 0 \(parallel \[\s*\(set \(reg:DI (\d+) (\w+) \[(?:orig:)?(\d+)"
)
ITEM = re.compile(r"\n(?=\((?:insn|jump_insn|call_insn|code_label|note|barrier|debug_insn) )")
LOOKAHEAD = 40  # instructions followed after the inserted one


def clobbers(dump: str) -> list[str]:
    found = []
    for function in re.split(r"\n(?=;; Function )", dump):
        name = function.split("\n", 1)[0].removeprefix(";; Function ")[:80]
        items = ITEM.split(function)
        for uid, regno, reg, pseudo in INSERTED.findall(function):
            if reg == "zero":
                continue
            at = [i for i, item in enumerate(items) if item.startswith(f"(insn {uid} ")]
            if not at:
                continue
            same_reg = re.compile(rf"\(reg(?:/[a-z]+)*:DI {regno} {reg} \[(?:orig:)?(\d+)")
            for item in items[at[-1] + 1 : at[-1] + 1 + LOOKAHEAD]:
                if not item.startswith(("(insn", "(jump_insn", "(call_insn")):
                    continue
                head = r"\((?:insn|jump_insn|call_insn) \d+ \d+ \d+ \d+ \(set "
                sets = re.match(head + rf"\(reg(?:/[a-z]+)*:DI {regno} {reg}\b[^)]*\)", item)
                reads = same_reg.findall(item[sets.end() :] if sets else item)
                other = [p for p in reads if p != pseudo]
                if other:
                    found.append(
                        f"CLOBBER: inserted vsetvl insn {uid} writes {reg} (pseudo {pseudo}), "
                        f"next read as pseudo {other[0]} | {name}"
                    )
                    break
                if sets or reads:
                    break
    return found


def main(paths: list[str]) -> int:
    found = [line for path in paths for line in clobbers(open(path).read())]
    print("\n".join(found) if found else "no inserted vsetvl overwrites a live register")
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
