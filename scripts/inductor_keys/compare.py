"""Which of the recorded cache lookups (sitecustomize.py beside this file) could have found a graph
an earlier process put in the cache, and, for each that could not, which components of its key
differ from the nearest earlier key of another process.

    python scripts/inductor_keys/compare.py DIR
"""

from __future__ import annotations

import collections
import json
import re
import sys
from pathlib import Path

LINE = re.compile(r"\[(\w+)\] ([^:]+?): (.*)")


def components(entry: dict) -> dict[str, tuple[str, str]]:
    found = {}
    for line in entry["lines"]:
        match = LINE.match(line)
        if match:
            found[match.group(2)] = (match.group(1), match.group(3))
    return found


def differing(mine: dict, theirs: dict) -> list[str]:
    return sorted(n for n in set(mine) | set(theirs) if mine.get(n, ("",))[0] != theirs.get(n, ("",))[0])


def who(entry: dict) -> str:
    return f"pid {entry['pid']} ({'main thread' if entry['main_thread'] else 'thread ' + entry['thread']}; {' '.join(entry['argv'])[-60:]})"


def main() -> int:
    entries = sorted((json.loads(p.read_text()) for p in Path(sys.argv[1]).glob("*.json")), key=lambda e: e["time"])
    print(f"{len(entries)} lookups by {len({e['pid'] for e in entries})} processes")
    reasons: collections.Counter = collections.Counter()
    shown: set = set()
    for cache in ("aot_autograd", "fx_graph"):
        lookups = [e for e in entries if e["cache"] == cache]
        found = 0
        for index, entry in enumerate(lookups):
            earlier = [e for e in lookups[:index] if e["pid"] != entry["pid"]]
            if not earlier:
                continue
            if any(e["key"] == entry["key"] for e in earlier):
                found += 1
                continue
            mine = components(entry)
            nearest = min(earlier, key=lambda e: len(differing(mine, components(e))))
            names = differing(mine, components(nearest))
            reasons[(cache, tuple(names[:8]))] += 1
            if (cache, tuple(names[:8])) in shown:
                continue
            shown.add((cache, tuple(names[:8])))
            theirs = components(nearest)
            print(f"{cache}: {who(entry)} found nothing; nearest: {who(nearest)}")
            for name in names[:6]:
                before, here = theirs.get(name, ("", "-"))[1], mine.get(name, ("", "-"))[1]
                if before == here:  # as torch/_inductor/codecache.py found the memory format's module by import order
                    print(f"  {name}: the same text, hashed otherwise: something in it is pickled by a name its text does not show")
                else:
                    print(f"  {name}:\n    earlier: {before[:400]}\n    here:    {here[:400]}")
        print(f"{cache}: {len(lookups)} lookups; {found} had an earlier process's key")
    for (cache, names), count in reasons.most_common():
        print(f"{count}x {cache} differs in: {', '.join(names) or 'nothing recorded'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
