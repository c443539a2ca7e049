#!/usr/bin/env bash
# Train on digits under mpirun once per codec and print a side-by-side table.
#
#   bash examples/demo.sh                      # NP=2, CODECS="none onebit"
#   NP=4 CODECS="none fp16 onebit onebit-noef qsgd:coding=elias" bash examples/demo.sh --epochs 40
#
# Environment: NP (ranks, default 2), CODECS (default "none onebit"), PY (default
# .venv/bin/python), MPIRUN (default mpirun), TIMEOUT (seconds per run, default 300).
# Extra arguments go to every train.py run. Exits non-zero if any run fails.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
NP=${NP:-2}
CODECS=${CODECS:-"none onebit"}
PY=${PY:-.venv/bin/python}
MPIRUN=${MPIRUN:-mpirun}
TIMEOUT=${TIMEOUT:-300}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

command -v "$MPIRUN" >/dev/null || { echo "demo: $MPIRUN not found on PATH" >&2; exit 1; }
[ -x "$PY" ] || { echo "demo: python $PY not found (set PY=...)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=()
for codec in $CODECS; do
    # NAME or NAME:KEY=VALUE,KEY=VALUE (each pair becomes a --codec-opt)
    name=${codec%%:*}
    opts=()
    if [[ $codec == *:* ]]; then
        IFS=',' read -ra pairs <<<"${codec#*:}"
        for pair in "${pairs[@]}"; do opts+=(--codec-opt "$pair"); done
    fi
    echo "== $codec: $MPIRUN -np $NP $PY examples/train.py --codec $name ${opts[*]} --json --no-progress $*" >&2
    timeout -k 10 "$TIMEOUT" "$MPIRUN" --allow-run-as-root --oversubscribe -np "$NP" \
        "$PY" examples/train.py --codec "$name" "${opts[@]}" --label "$codec" --json --no-progress "$@" \
        >"$tmp/$codec.out"
    rc=$?
    grep -v '^{' "$tmp/$codec.out" >&2
    tail -n 1 "$tmp/$codec.out" | grep '^{' >>"$tmp/results.jsonl"
    if [ $rc -ne 0 ]; then
        [ $rc -eq 124 ] && why="timed out after ${TIMEOUT}s" || why="rc=$rc"
        echo "demo: --codec $codec failed ($why)" >&2
        failed+=("$codec")
    fi
done

if [ -s "$tmp/results.jsonl" ]; then
    "$PY" - "$tmp/results.jsonl" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
base = next((r["test_accuracy"] for r in rows if r["codec"] == "none"), None)
head = ("codec", "ranks", "epochs", "test acc", "vs none", "bytes/step sent", "dense bytes/step", "ratio",
        "seconds", "identical")
cells = [(r["codec"], str(r["ranks"]), str(r["epochs"]), f"{r['test_accuracy']:.4f}",
          "-" if base is None else f"{100 * (r['test_accuracy'] - base):+.2f} pt",
          f"{r['bytes_sent_per_step']:,.0f}", f"{r['bytes_dense_per_step']:,.0f}",
          f"{r['wire_ratio']:.1f}x" if r["wire_ratio"] else "-", f"{r['seconds']:.1f}",
          "yes" if r["params_identical"] else "NO")
         for r in rows]
w = [max(len(x) for x in col) for col in zip(head, *cells)]
for i, row in enumerate([head] + cells):
    print("  ".join(c.ljust(n) if j == 0 else c.rjust(n) for j, (c, n) in enumerate(zip(row, w))))
    if i == 0:
        print("  ".join("-" * n for n in w))
EOF
fi

if [ ${#failed[@]} -ne 0 ]; then
    echo "demo: failed: ${failed[*]}" >&2
    exit 1
fi
