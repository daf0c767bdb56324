#!/usr/bin/env bash
# The hardware check: calibrate Qwen3-0.6B (architecture preset, random weights) on a CUDA
# device and run the falsifier, from the source tree (no install step: the machine may have no
# package registry; it needs python3 with torch, transformers, numpy and tabulate).
#
#   scripts/device-check.sh OUT_DIR            # writes 8 files and results/<machine-key>/
#
# The device tool brings back at most 8 files: pack them, e.g.
#   scripts/device-check.sh /tmp/dc; tar czf "$OUT/device-check.tgz" -C /tmp/dc .
#
# Environment: DEVICE (default cuda), MODEL (default qwen3-0.6b), DTYPE (default: the
# library's, bfloat16 on CUDA), EXTRA (more flags for both commands, e.g. "--dry-run").
# Files: env.txt (versions, nvidia-smi), calibrate.json/.txt/.log, demo.json/.txt/.log
# (.txt is the printed report, .log the progress lines from stderr).
set -euo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: $0 OUT_DIR" >&2
    exit 2
fi
out=$1
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

device=${DEVICE:-cuda}
model=${MODEL:-qwen3-0.6b}
flags=(--model "$model" --device "$device")
if [[ -n ${DTYPE:-} ]]; then flags+=(--dtype "$DTYPE"); fi
# shellcheck disable=SC2206  # EXTRA is split on purpose
if [[ -n ${EXTRA:-} ]]; then flags+=($EXTRA); fi

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    python3 - <<'EOF'
import platform, torch, transformers, numpy, tabulate
print("python", platform.python_version(), "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| transformers", transformers.__version__, "| numpy", numpy.__version__,
      "| tabulate", tabulate.__version__)
print("cuda available:", torch.cuda.is_available(),
      "| devices:", [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
EOF
    nvidia-smi || true
} >"$out/env.txt" 2>&1
cat "$out/env.txt"

if [[ $device == cuda* ]] && ! python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "device-check: $device asked for, but torch sees no CUDA device (see $out/env.txt)" >&2
    exit 1
fi

run() {  # run NAME ARGS...: the report to NAME.txt (and the terminal), progress to NAME.log
    local name=$1
    shift
    echo "== prefill-bench $name $*"
    local start=$SECONDS
    python3 -m pytest_prefill "$name" "$@" --json "$out/$name.json" \
        2> >(tee "$out/$name.log" >&2) | tee "$out/$name.txt"
    echo "== $name took $((SECONDS - start)) s"
}

run calibrate "${flags[@]}"
run demo "${flags[@]}" --cost "$out/calibrate.json"

# The hardware suite as a user runs it: calibration, falsifier, fidelity (skips on CUDA: the
# engine disaggregates on CPU only), archived under OUT_DIR/results/<machine-key>/.
echo "== pytest -m gpu benchmarks"
start=$SECONDS
pytest_flags=(--prefill-model "$model" --prefill-device "$device" --prefill-results "$out/results")
if [[ -n ${DTYPE:-} ]]; then pytest_flags+=(--prefill-dtype "$DTYPE"); fi
if [[ ${EXTRA:-} == *--dry-run* ]]; then pytest_flags+=(--prefill-dry-run); fi
set +e
python3 -m pytest -m gpu -p no:cacheprovider -rs "${pytest_flags[@]}" benchmarks \
    2>&1 | tee "$out/pytest-gpu.txt"
status=${PIPESTATUS[0]}
set -e
echo "== pytest -m gpu exited $status after $((SECONDS - start)) s"
echo "device-check: wrote $(ls "$out" | tr '\n' ' ')"
