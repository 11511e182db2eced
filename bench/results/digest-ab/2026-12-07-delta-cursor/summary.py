"""The two interleaved A/Bs of this folder: the digest cursor keeping its row start and key block (new) against
the tree before it (old, the same build with the previous librefit-test.so via LD_LIBRARY_PATH), and digests off.
checked/R-ARM.json: refit-bench --scenario delta --net shm --fraction 0.01 --versions 3 (delta_checked_ms: the delta
receiver's transfer + check, median of versions 2-3); apply/R-ARM.txt: the same with --versions 4 and the apply
alone timed by a temporary patch around refit_delta_apply_hashed (one line per source rank's apply: pid, hashed or
plain, ms, units; two per pull).   python3 summary.py"""
import collections, glob, json, os, statistics as st

here = os.path.dirname(os.path.abspath(__file__))


def rng(xs):
    return f"{st.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"


C = collections.defaultdict(dict)
for f in glob.glob(os.path.join(here, "checked", "*-*.json")):
    r, a = os.path.basename(f)[:-5].split("-")
    C[int(r)][a] = json.load(open(f))["median"]["delta_checked_ms"]
A = collections.defaultdict(dict)
for f in glob.glob(os.path.join(here, "apply", "*-*.txt")):
    r, a = os.path.basename(f)[:-4].split("-")
    xs = [float(line.split()[2]) for line in open(f)]
    A[int(r)][a] = st.median(xs[i] + xs[i + 1] for i in range(0, len(xs) - 1, 2))
for name, R in (("delta receiver, transfer + check (ms)", C), ("apply per pull (ms)", A)):
    rs = sorted(r for r in R if len(R[r]) == 3)
    print(f"{name}, {len(rs)} rounds:")
    for r in rs:
        print(f"  round {r}: " + ", ".join(f"{a} {R[r][a]:.1f}" for a in ("old", "new", "off")))
    print("  new/old " + rng([R[r]["new"] / R[r]["old"] for r in rs]) + ", new/off " +
          rng([R[r]["new"] / R[r]["off"] for r in rs]) + ", old/off " + rng([R[r]["old"] / R[r]["off"] for r in rs]))
pairs = [C[r]["new"] / C[r]["old"] for r in C if len(C[r]) == 3] + [A[r]["new"] / A[r]["old"] for r in A if len(A[r]) == 3]
print(f"all {len(pairs)} pairs new/old: " + rng(pairs) + f", {sum(p < 1 for p in pairs)} below 1")
