#!/usr/bin/env python3
"""librefit.so's exported symbols against the stable and experimental headers (docs/api.md).

The stable set is what include/refit/*.h declare (REFIT_API functions), the experimental set what
include/refit/experimental/*.h declare.  Checked:
  - no function is declared in both sets, and no stable header includes an experimental one;
  - src/refit.map's node REFIT_1 lists exactly the stable set, REFIT_EXPERIMENTAL exactly the experimental one;
  - the library (readelf --dyn-syms) exports every declared function, each under its set's version node as the
    default version (name@@REFIT_1 or name@@REFIT_EXPERIMENTAL), and nothing else: no undeclared symbol, no
    symbol without a version, no symbol of another library linked in.
Usage: test_abi_symbols.py LIBREFIT_SO SOURCE_DIR
"""
import glob
import os
import re
import subprocess
import sys

NODES = {"stable": "REFIT_1", "experimental": "REFIT_EXPERIMENTAL"}


def declared(paths):
    """{function: header} of the REFIT_API declarations in these headers (comments removed)."""
    out = {}
    for path in sorted(paths):
        text = re.sub(r"/\*.*?\*/", " ", open(path).read(), flags=re.S)
        for name in re.findall(r"REFIT_API\s+[^;(]*?\b(refit_\w+)\s*\(", text):
            out[name] = os.path.basename(path)
    return out


def map_nodes(path):
    """{node: set of global names} of a version script."""
    text = re.sub(r"/\*.*?\*/", " ", open(path).read(), flags=re.S)
    nodes = {}
    for node, body in re.findall(r"([A-Za-z_][\w.]*)\s*\{(.*?)\}\s*[\w.]*\s*;", text, flags=re.S):
        glob_part = re.split(r"\blocal\s*:", body)[0]
        glob_part = re.sub(r"\bglobal\s*:", " ", glob_part)
        nodes[node] = {n.strip() for n in glob_part.split(";") if n.strip()}
    return nodes


def exported(so):
    """[(name, version or None, default)] of the library's defined dynamic symbols (not the version nodes)."""
    out = subprocess.run(["readelf", "--dyn-syms", "-W", so], check=True, capture_output=True, text=True).stdout
    syms = []
    for line in out.splitlines():
        f = line.split()
        if len(f) < 8 or not f[0].rstrip(":").isdigit() or f[6] == "UND":
            continue
        if f[3] == "SECTION" or f[6] == "ABS" and f[3] == "OBJECT" and "@" not in f[7]:
            continue  # the version nodes themselves (REFIT_1, REFIT_EXPERIMENTAL)
        name, ver, default = f[7], None, False
        if "@@" in name:
            name, ver = name.split("@@", 1)
            default = True
        elif "@" in name:
            name, ver = name.split("@", 1)
        syms.append((name, ver, default))
    return syms


def check(so, root):
    problems = []
    inc = os.path.join(root, "include", "refit")
    sets = {"stable": declared(glob.glob(os.path.join(inc, "*.h"))),
            "experimental": declared(glob.glob(os.path.join(inc, "experimental", "*.h")))}
    if len(sets["stable"]) < 50 or len(sets["experimental"]) < 10:
        problems.append(f"too few declarations found ({len(sets['stable'])} stable, "
                        f"{len(sets['experimental'])} experimental): is {inc} the headers?")
    for name in sorted(set(sets["stable"]) & set(sets["experimental"])):
        problems.append(f"{name}: declared in the stable {sets['stable'][name]} and the experimental "
                        f"{sets['experimental'][name]}")
    for path in sorted(glob.glob(os.path.join(inc, "*.h"))):
        for line in open(path):
            if re.match(r'\s*#\s*include\s*["<]refit/experimental/', line):
                problems.append(f"stable header {os.path.basename(path)} includes an experimental one: {line.strip()}")

    nodes = map_nodes(os.path.join(root, "src", "refit.map"))
    for kind, node in NODES.items():
        listed = nodes.get(node)
        if listed is None:
            problems.append(f"src/refit.map has no node {node}")
            continue
        for name in sorted(set(sets[kind]) - listed):
            problems.append(f"{name} ({kind}, {sets[kind][name]}): not in node {node} of src/refit.map")
        for name in sorted(listed - set(sets[kind])):
            problems.append(f"{name}: in node {node} of src/refit.map but declared in no {kind} header")

    want = {name: NODES[kind] for kind in sets for name in sets[kind]}
    seen = set()
    for name, ver, default in exported(so):
        seen.add(name)
        if name not in want:
            problems.append(f"{name}@{ver}: exported but declared in no header (stable or experimental)")
        elif ver != want[name] or not default:
            problems.append(f"{name}: exported as {name}{'@@' if default else '@'}{ver}, expected {name}@@{want[name]}")
    for name in sorted(set(want) - seen):
        problems.append(f"{name}: declared ({'stable' if want[name] == 'REFIT_1' else 'experimental'}) "
                        f"but not exported by {os.path.basename(so)}")
    return problems, sets


def main():
    so, root = sys.argv[1], sys.argv[2]
    problems, sets = check(so, root)
    for p in problems:
        print("FAIL: " + p)
    if problems:
        return 1
    print(f"ok: {len(sets['stable'])} stable functions under REFIT_1, {len(sets['experimental'])} experimental "
          f"under REFIT_EXPERIMENTAL, nothing else exported by {so}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
