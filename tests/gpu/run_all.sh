#!/usr/bin/env bash
# Run every example scenario under `memdoc run` on a GPU machine, and write each trace
# (NAME.memdoc), each program's output (NAME.log) and a summary (summary.md, summary.json:
# scenario, expected rule, top finding, pass/fail) to OUTDIR.
#
#   tests/gpu/run_all.sh OUTDIR
#
# Each scenario may run SCENARIO_TIMEOUT_S seconds (default 90); scenarios that would start
# after TOTAL_BUDGET_S seconds (default 420) are reported as skipped, so the whole run stays
# under 8 minutes. MEMDOC_EXAMPLES=a,b runs only those scenarios; PYTHON picks the interpreter.
# Scenarios whose framework is missing (TensorFlow on most GPU boxes) are reported as skipped.
# Exit status: 0 when no scenario failed. To bring the results back as one file:
#   tar -C OUTDIR -czf gpu-examples.tgz .
set -u -o pipefail

outdir=${1:?usage: tests/gpu/run_all.sh OUTDIR}
repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${PYTHON:-python3}
per_scenario_s=${SCENARIO_TIMEOUT_S:-90}
budget_s=${TOTAL_BUDGET_S:-420}

mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)
cd "$repo" || exit 2
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
: >"$outdir/runs.tsv"
gpu_used() {
    nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>/dev/null | paste -sd' ' || true
}
nvidia-smi >"$outdir/nvidia-smi.txt" 2>&1 || echo "nvidia-smi not available" >"$outdir/nvidia-smi.txt"

plan=$("$python" -m tests.gpu.summarize plan) || exit 2
start=$SECONDS
while IFS=$'\t' read -r name script skip; do
    if [[ -n "$skip" ]]; then
        printf '%s\tskipped\t%s\n' "$name" "$skip" >>"$outdir/runs.tsv"
        continue
    fi
    if ((SECONDS - start + per_scenario_s > budget_s)); then
        printf '%s\tskipped\tout of time (the whole run is limited to %s s)\n' "$name" "$budget_s" >>"$outdir/runs.tsv"
        continue
    fi
    echo "== $name (GPU memory used before: $(gpu_used))" | tee "$outdir/$name.log"
    began=$SECONDS
    timeout -k 10 "$per_scenario_s" "$python" -m memdoc run -q --force \
        -o "$outdir/$name.memdoc" "$script" >>"$outdir/$name.log" 2>&1
    code=$?
    printf '%s\tran\t%s\t%s\n' "$name" "$code" "$((SECONDS - began))" >>"$outdir/runs.tsv"
    echo "   exit $code after $((SECONDS - began)) s"
done <<<"$plan"

"$python" -m tests.gpu.summarize report "$outdir"
