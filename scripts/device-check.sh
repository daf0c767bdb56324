#!/usr/bin/env bash
# The device check, for the day a CUDA device is lent: a preflight (is what will be timed
# right?), then the `gpu` suite in three stages -- calibration (cost model v2, held-out error,
# host share, C* by context, KV capacity), the falsifier (its chunk from that calibration),
# fidelity (the colocated policies on one device; disaggregation reported as not run) -- with
# the qwen3-0.6b preset (random weights: nothing is downloaded), from the source tree, no install.
#
#   scripts/device-check.sh [OUT_DIR]      # default: $OUT (the device tool's folder)
#
# Every file lands in OUT_DIR as soon as it is made, so a run stopped at any point still
# brings back what finished (the device tool brings back at most 8 files):
#   env.txt              versions, nvidia-smi, the commit            (first, at once)
#   preflight.json       packed pass vs the HF forward, chunks over the cache vs the whole
#                        prompt, batched decode rows, placement and dtype, SDPA kernels
#   pytest-gpu.txt       every stage's terminal output, appended as it is printed
#   run-calibration.json, run-falsifier.json, run-fidelity.json   each stage's archived run
#   summary.txt          C*, held-out error, host share, the falsifier's verdict, fidelity:
#                        rewritten after every stage
# It ends within BUDGET seconds (default 480) plus a 10 s grace per stage: each stage's own
# limit (CAL_LIMIT 200, FALSIFIER_LIMIT 90, FIDELITY_LIMIT 150, PREFLIGHT_LIMIT 90) is cut to
# what the budget has left, well under the device tool's 600 s.
#
# Environment: DEVICE (default cuda), MODEL (default qwen3-0.6b), DTYPE (default: bfloat16 on
# CUDA), EXTRA (more pytest flags, e.g. "--prefill-dry-run"), BUDGET and the stage limits
# (seconds), PYTHON (default python3), PYTEST_PREFILL_COMMIT (the commit, where .git does not
# travel: `PYTEST_PREFILL_COMMIT=$(git rev-parse HEAD) scripts/device-check.sh`; else the file
# .device-commit, else git).
# A CPU rehearsal: DEVICE=cpu MODEL=tiny EXTRA=--prefill-dry-run scripts/device-check.sh /tmp/dc
set -uo pipefail # no -e: every stage runs, and says how it ended

out=${1:-${OUT:-}}
if [[ -z $out ]]; then
    echo "usage: $0 OUT_DIR   (or set OUT)" >&2
    exit 2
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
work=$(mktemp -d "${TMPDIR:-/tmp}/device-check.XXXXXX")
started=$SECONDS

device=${DEVICE:-cuda}
model=${MODEL:-qwen3-0.6b}
py=${PYTHON:-python3}
budget=${BUDGET:-480}
commit=${PYTEST_PREFILL_COMMIT:-$(cat .device-commit 2>/dev/null || git rev-parse HEAD 2>/dev/null || echo unknown)}
export PYTEST_PREFILL_COMMIT=$commit # the archived runs are named by it where git is absent

left() { echo $((budget - (SECONDS - started))); }
# the limit of a stage: its own, cut to the budget left less a reserve for the summary
limit_of() {
    local own=$1 rest
    rest=$(($(left) - 15))
    echo $((own < rest ? own : rest))
}
# a file into OUT whole or not at all (a copy cut short never passes for the file)
land() { cp "$1" "$out/.$2.part" && mv "$out/.$2.part" "$out/$2"; }
summarise() {
    "$py" -m pytest_prefill.lab.device_check "$out" >"$out/.summary.txt.part" 2>&1
    mv "$out/.summary.txt.part" "$out/summary.txt"
}

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $commit"
    echo "device $device, model $model, dtype ${DTYPE:-default}, budget ${budget} s"
    "$py" - <<'EOF' || echo "($py cannot import torch, transformers, numpy or tabulate)"
import platform, torch, transformers, numpy, tabulate
print("python", platform.python_version(), "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| transformers", transformers.__version__, "| numpy", numpy.__version__,
      "| tabulate", tabulate.__version__)
print("cuda available:", torch.cuda.is_available(),
      "| devices:", [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
if torch.cuda.is_available():
    free, total = torch.cuda.mem_get_info()
    print(f"memory: {free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB")
EOF
    nvidia-smi 2>&1 || true
} >"$work/env.txt" 2>&1
land "$work/env.txt" env.txt
cat "$out/env.txt"

if [[ $device == cuda* ]] && ! "$py" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "device-check: $device asked for, but torch sees no CUDA device (see env.txt)" >&2
    summarise
    exit 1
fi

# 1. the preflight, before anything is timed
pre=(--model "$model" --device "$device" --out "$work/preflight.json")
if [[ -n ${DTYPE:-} ]]; then pre+=(--dtype "$DTYPE"); fi
limit=$(limit_of "${PREFLIGHT_LIMIT:-90}")
echo "== preflight (limit ${limit} s)"
timeout --signal=INT --kill-after=10 "$limit" "$py" -m pytest_prefill.lab.preflight "${pre[@]}"
echo "device-check: preflight exited $?"
[[ -f $work/preflight.json ]] && land "$work/preflight.json" preflight.json
summarise

# 2. the suite, one stage at a time; each archives its own run
flags=(-m gpu -p no:cacheprovider -rs -v --prefill-model "$model" --prefill-device "$device"
    --prefill-results "$work/results" --prefill-save)
# from a source tree the plugin is named; where it is installed its entry point loads it
if ! "$py" -c "import importlib.metadata as m, sys; sys.exit(not any(e.value == 'pytest_prefill.plugin' for e in m.entry_points(group='pytest11')))"; then
    flags=(-p pytest_prefill.plugin "${flags[@]}")
fi
if [[ -n ${DTYPE:-} ]]; then flags+=(--prefill-dtype "$DTYPE"); fi
# shellcheck disable=SC2206  # EXTRA is split on purpose
if [[ -n ${EXTRA:-} ]]; then flags+=($EXTRA); fi

newest_run() { ls -t "$work"/results/*/0*.json 2>/dev/null | head -n 1; }
status=0
stage() { # name, own limit, test file, more flags...
    local name=$1 own=$2 file=$3 limit before after code
    shift 3
    limit=$(limit_of "$own")
    if ((limit < 20)); then
        echo "device-check: $name not run: ${limit} s left for it (the budget or its limit)" |
            tee -a "$out/pytest-gpu.txt"
        status=1
        return
    fi
    echo "== $name: $py -m pytest ${flags[*]} $* pytest_prefill/suite/$file (limit ${limit} s)" |
        tee -a "$out/pytest-gpu.txt"
    before=$(newest_run)
    timeout --signal=INT --kill-after=10 "$limit" "$py" -m pytest "${flags[@]}" "$@" \
        "pytest_prefill/suite/$file" 2>&1 | tee -a "$out/pytest-gpu.txt" | tail -n 40
    code=${PIPESTATUS[0]}
    echo "device-check: $name exited $code after $((SECONDS - started)) s in all" |
        tee -a "$out/pytest-gpu.txt"
    ((code == 0)) || status=$code
    after=$(newest_run)
    if [[ -n $after && $after != "$before" ]]; then land "$after" "run-$name.json"; fi
    summarise
}

stage calibration "${CAL_LIMIT:-200}" test_calibration.py
calibration=$(ls "$out/run-calibration.json" 2>/dev/null)
if [[ -n $calibration ]]; then # the falsifier's chunk from that calibration, not a second one
    stage falsifier "${FALSIFIER_LIMIT:-90}" test_falsifier.py --prefill-cost "$calibration"
else
    stage falsifier "${FALSIFIER_LIMIT:-90}" test_falsifier.py
fi
stage fidelity "${FIDELITY_LIMIT:-150}" test_fidelity.py

cat "$out/summary.txt"
echo "device-check: $(ls "$out" | tr '\n' ' ')in $out after $((SECONDS - started)) s"
exit "$status"
