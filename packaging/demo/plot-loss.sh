#!/bin/sh
# packaging/demo/plot-loss.sh [FILE]: an ASCII loss curve of a project's
# training rounds, from the JSON of `GET /v1/projects/<name>/rounds`
# ({"rounds": [{"version", "samples", "loss", "seconds", ...}, ...]}, newest
# first; a bare list is taken too), read from FILE or standard input:
#
#   curl -fsS http://127.0.0.1:8480/v1/projects/demo/rounds | plot-loss.sh
#
# Rounds without a loss (not committed yet) are left out.  Plots loss over
# version, one column a round (rounds averaged into columns past
# COTRAIN_PLOT_WIDTH, default 60; COTRAIN_PLOT_HEIGHT rows, default 12),
# then one summary line: rounds, samples, first and last loss, seconds per
# round.  Needs only python3's standard library.  Exit 0; 1 for input that
# is not such JSON.
set -eu
prog=$(cat <<'EOF'
import json, math, os, sys

def die(msg):
    sys.stderr.write("plot-loss: error: %s\n" % msg)
    sys.exit(1)

def env_int(name, default, lo, hi):
    try:
        v = int(os.environ.get(name, default))
    except ValueError:
        die("%s must be an integer" % name)
    return min(max(v, lo), hi)

src = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "-" else None
try:
    raw = open(src, "rb").read(64 << 20) if src else sys.stdin.buffer.read(64 << 20)
    doc = json.loads(raw.decode("utf-8"))
except (OSError, UnicodeDecodeError, ValueError) as e:
    die("could not read the rounds JSON%s: %s" % (" of \"%s\"" % src if src else "", e))
rounds = doc.get("rounds") if isinstance(doc, dict) else doc
if not isinstance(rounds, list):
    die("the JSON has no \"rounds\" list")

def num(r, k):
    v = r.get(k) if isinstance(r, dict) else None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return v

pts = {}
for r in rounds:
    v, loss = num(r, "version"), num(r, "loss")
    if v is None or loss is None:
        continue
    pts[int(v)] = (loss, num(r, "samples") or 0, num(r, "seconds"))
if not pts:
    print("plot-loss: no round has a loss yet")
    sys.exit(0)
vs = sorted(pts)
W = env_int("COTRAIN_PLOT_WIDTH", 60, 10, 400)
H = env_int("COTRAIN_PLOT_HEIGHT", 12, 3, 100)

# Columns: one a round, or consecutive rounds averaged.
ncol = min(W, len(vs))
cols = []
for c in range(ncol):
    part = vs[c * len(vs) // ncol:(c + 1) * len(vs) // ncol]
    cols.append(sum(pts[v][0] for v in part) / len(part))
lo, hi = min(cols), max(cols)
if hi - lo < 1e-9:
    lo, hi = lo - 0.5, hi + 0.5
row_of = lambda y: int(round((hi - y) / (hi - lo) * (H - 1)))

grid = [[" "] * ncol for _ in range(H)]
for c, y in enumerate(cols):
    grid[row_of(y)][c] = "*"
print("loss")
for i, line in enumerate(grid):
    label = hi - (hi - lo) * i / (H - 1)
    print("%8.3f |%s" % (label, "".join(line).rstrip()))
print("%8s +%s" % ("", "-" * ncol))
left, right = "v%d" % vs[0], "v%d" % vs[-1]
print("%8s  %s" % ("", left if len(vs) == 1 else left + " " * max(1, ncol - len(left) - len(right)) + right))

first, last = pts[vs[0]][0], pts[vs[-1]][0]
samples = sum(int(pts[v][1]) for v in vs)
secs = [pts[v][2] for v in vs if pts[v][2] is not None and pts[v][2] >= 0]
per = " , %.1f s a round" % (sum(secs) / len(secs)) if secs else ""
print("%d round%s, model v%d -> v%d, %d samples, loss %.4f -> %.4f%s"
      % (len(vs), "" if len(vs) == 1 else "s", vs[0], vs[-1] + 1, samples, first, last, per.replace(" ,", ",")))
EOF
)
exec python3 -c "$prog" "$@"
