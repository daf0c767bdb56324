#!/usr/bin/env bash
# The device check, for the day a CUDA device is lent: the `gpu` suite -- calibration (cost
# model v2, held-out error, C* by context, KV capacity), the falsifier and the fidelity test
# (the colocated policies on one device; disaggregation reported as not run) -- with the
# qwen3-0.6b preset (random weights: nothing is downloaded), from the source tree, no install:
#
#   PYTHONPATH=. python3 -m pytest -p pytest_prefill.plugin -m gpu pytest_prefill/suite ...
#
#   scripts/device-check.sh [OUT_DIR]      # default: $OUT (the device tool's folder)
#
# It needs python3 with torch, transformers, numpy and tabulate, and finishes in under 10
# minutes on one H200 (LIMIT seconds for the suite, default 540; it is stopped there and what
# it wrote is still packed). The device tool brings back at most 8 files, so OUT_DIR receives
# four: summary.txt (verdicts and headline figures), pytest-gpu.txt (the terminal summary),
# env.txt (versions, nvidia-smi) and device-check.tgz (all of it, with the archived run JSON).
#
# Environment: DEVICE (default cuda), MODEL (default qwen3-0.6b), DTYPE (default: bfloat16 on
# CUDA), EXTRA (more pytest flags, e.g. "--prefill-dry-run"), LIMIT (seconds, default 540),
# PYTHON (default python3).
# A CPU rehearsal: DEVICE=cpu MODEL=small EXTRA=--prefill-dry-run scripts/device-check.sh /tmp/dc
set -euo pipefail

out=${1:-${OUT:-}}
if [[ -z $out ]]; then
    echo "usage: $0 OUT_DIR   (or set OUT)" >&2
    exit 2
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
work=$(mktemp -d "${TMPDIR:-/tmp}/device-check.XXXXXX")

device=${DEVICE:-cuda}
model=${MODEL:-qwen3-0.6b}
limit=${LIMIT:-540}
py=${PYTHON:-python3}

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
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
    nvidia-smi || true
} >"$work/env.txt" 2>&1
cat "$work/env.txt"

if [[ $device == cuda* ]] && ! "$py" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "device-check: $device asked for, but torch sees no CUDA device (see env.txt)" >&2
    cp "$work/env.txt" "$out/"
    exit 1
fi

flags=(-p pytest_prefill.plugin -m gpu -p no:cacheprovider -rs -v
    --prefill-model "$model" --prefill-device "$device" --prefill-results "$work/results")
if [[ -n ${DTYPE:-} ]]; then flags+=(--prefill-dtype "$DTYPE"); fi
# Archiving is on request in newer versions of the plugin: ask when the option exists.
if "$py" -m pytest -p pytest_prefill.plugin --help 2>/dev/null | grep -q -- '--prefill-save'; then
    flags+=(--prefill-save)
fi
# shellcheck disable=SC2206  # EXTRA is split on purpose
if [[ -n ${EXTRA:-} ]]; then flags+=($EXTRA); fi

# the hardware suite ships in the package (older checkouts kept it in benchmarks/)
suite=pytest_prefill/suite
[[ -d $suite ]] || suite=benchmarks
echo "== $py -m pytest ${flags[*]} $suite   (limit ${limit} s)"
start=$SECONDS
set +e
timeout --signal=INT --kill-after=30 "$limit" "$py" -m pytest "${flags[@]}" "$suite" \
    >"$work/pytest-gpu.txt" 2>&1
status=$?
set -e
elapsed=$((SECONDS - start))
tail -n 120 "$work/pytest-gpu.txt"

{
    echo "device-check: pytest -m gpu exited $status after $elapsed s (limit $limit s)"
    echo "device $device, model $model; $(grep -m1 'cuda available' "$work/env.txt" || true)"
    grep -E "HOLDS|FAILS|passed|failed|skipped|median \|relative error\||Held-out error|C\* by context|^ +0:|Prefer|WARNING|BUSY|not run" \
        "$work/pytest-gpu.txt" | head -n 60 || true
    "$py" - "$work/results" <<'EOF' || true
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("*/*.json")):
    if path.name == "machine.json":
        continue
    doc = json.loads(path.read_text())
    cal = doc.get("calibration") or {}
    cost = cal.get("cost_model") or {}
    print(f"{path.name}: C* {cal.get('chunk_star')}, by context {cal.get('chunk_star_by_context')}, "
          f"held-out median {cal.get('held_out_median_error')}, recommendation {cal.get('recommendation')}")
    for key in ("prefill_pass_overhead", "prefill_per_token", "prefill_per_pair", "decode_step_base",
                "decode_per_seq", "decode_per_kv_token", "fusion_penalty", "kv_capacity_tokens"):
        print(f"  {key} = {cost.get(key)}")
EOF
} >"$work/summary.txt" 2>&1
cat "$work/summary.txt"

tar czf "$out/device-check.tgz" -C "$work" .
cp "$work/summary.txt" "$work/pytest-gpu.txt" "$work/env.txt" "$out/"
echo "device-check: wrote $(ls "$out" | tr '\n' ' ')in $out"
exit "$status"
