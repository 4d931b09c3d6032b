"""Where a kernel's first loads wait for each other, from its SASS (no GPU needed).

    CUOBJDUMP=/path/to/cuobjdump python tools/sass_load_order.py OBJECT REGEX

For each kernel of OBJECT (a .o, .cubin or library with SASS) whose name matches REGEX, lists the
global loads after the programmatic wait (ACQBULK) in program order and the first instruction that
reads a register an earlier load writes. A warp stalls there until that load's value arrives, so a
load listed LATE goes out a memory round trip after the ones above it: the dependent loads of the
index chain are meant to be late, a level-1 index or a device scale is not (docs/PERFORMANCE.md v10c).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

LOADS_SHOWN = 12


def registers(text: str) -> set[int]:
    """Registers an operand list reads (R4.64 is R4 and R5)."""
    found = set()
    for number, wide in re.findall(r"\bR(\d+)(\.64)?\b", text):
        found.add(int(number))
        if wide:
            found.add(int(number) + 1)
    return found


def report(name: str, instructions: list[str]) -> None:
    start = next(i for i, s in enumerate(instructions) if s.startswith("ACQBULK"))
    loaded: set[int] = set()  # registers some earlier load writes
    stall = None
    shown = []
    for i in range(start, len(instructions)):
        text = re.sub(r"^@!?U?P\w+\s+", "", instructions[i])
        opcode, _, rest = text.partition(" ")
        operands = rest.split(",")
        reads = registers(",".join(operands[1:]))
        if stall is None and reads & loaded:
            stall = i
        if opcode.startswith("LDG"):
            first = int(re.search(r"R(\d+)", operands[0]).group(1))
            width = 4 if ".128" in opcode else 2 if ".64" in opcode else 1
            loaded.update(range(first, first + width))
            shown.append((i, stall is not None))
            if len(shown) == LOADS_SHOWN:
                break
    print(name)
    for i, late in shown:
        print(f"    {'LATE ' if late else '     '}{i - start:4d}  {instructions[i][:80]}")
    print(
        f"    first read of a loaded register: {stall - start if stall else None}  "
        f"{instructions[stall][:80] if stall else ''}"
    )


def main() -> None:
    obj, pattern = sys.argv[1], sys.argv[2]
    sass = subprocess.run(
        [os.environ.get("CUOBJDUMP", "cuobjdump"), "-sass", obj], capture_output=True, text=True, check=True
    ).stdout
    for part in re.split(r"\n\s+Function : ", sass)[1:]:
        name = part.split("\n", 1)[0]
        if re.search(pattern, name):
            report(name, [m.group(1).strip() for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+([^;]*);", part)])


if __name__ == "__main__":
    main()
