#!/bin/bash
# The command for a device `run` (lent H200), with `carry: [".gpu"]`:
#   bash ci/gpu/run-on-device.sh test  [pytest args]   # GPU tests: pytest tests/gpu -m gpu; server logs in $OUT/server-logs.tgz
#   bash ci/gpu/run-on-device.sh bench [bench args]    # python -m bench (default: --quick); server logs (and profiles/) in $OUT/bench-logs.tgz
#   bash ci/gpu/run-on-device.sh bench-per-gpu "ARGS0" "ARGS1" ...
#                                                     # one bench per GPU at once (CUDA_VISIBLE_DEVICES=i),
#                                                     # $OUT/bench-<i>/results.json; log, results.md, server logs, plot in $OUT/logs-<i>.tgz
#   bash ci/gpu/run-on-device.sh bench-seq "ARGS0" "ARGS1" ...
#                                                     # the same sweeps one after another on one GPU (same files)
#   bash ci/gpu/run-on-device.sh fixtures PRESET...    # only make the benchmark's fixtures (python -m bench fixtures --preset)
#   bash ci/gpu/run-on-device.sh env                   # only set up and report the environment
# Needs the offline bundle built here first, from the current series (refused otherwise):
#   make bundle          (ci/gpu/make-bundle.sh; + optional ci/gpu/build-extra.sh)
# Everything it writes goes under $OUT (device tool) or ./build/device-out.
# DEVICE_TIMEOUT (default 560 s, at most 565): the run is interrupted (SIGINT: servers stopped, results
# kept) early enough to stop and pack before the device's 10-minute limit.
set -uo pipefail
cd "$(dirname "$0")/../.."
mode="${1:-test}"; shift || true
OUT="${OUT:-$PWD/build/device-out}"
mkdir -p "$OUT"
log() { echo "[run-on-device] $*" | tee -a "$OUT/run-on-device.log" >&2; }

[ -f .gpu/setup.sh ] && [ -f .gpu/tree.tar.xz ] || { log "no .gpu/ bundle: build it with make bundle [SGLANG_REF=<line>] and carry .gpu"; exit 2; }
line=$(cat .gpu/line 2>/dev/null || true)
stamp=$(bash ci/gpu/patches-stamp.sh "$(cat .gpu/line-dir 2>/dev/null || echo .)")
if [ "$(cat .gpu/patches.sha256 2>/dev/null)" != "$stamp" ] && [ -z "${ALLOW_STALE_BUNDLE:-}" ]; then
  log "the .gpu bundle was not built from this checkout's patches (stamp $(cat .gpu/patches.sha256 2>/dev/null || echo missing), series $stamp):"
  log "run 'make bundle SGLANG_REF=${line:-<ref>}' here and carry .gpu again (ALLOW_STALE_BUNDLE=1 runs it anyway)"
  exit 2
fi
t0=$(date +%s)
bash .gpu/setup.sh || { log "setup.sh failed"; exit 2; }
extra=""
if ls .gpu/extra/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-extra .gpu/extra/*.whl \
    || { log "installing .gpu/extra wheels failed"; exit 2; }
  extra=":/tmp/site-extra"
fi
export PYTHONPATH="/tmp/sgltree/python:/tmp/site${extra}:$PWD"
export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 PYTHONUNBUFFERED=1 SGLANG_TREE=/tmp/sgltree
# A stand-in cutlass (stub-package:cutlass) passes flashinfer's CuTe-DSL check, whose norm kernels
# then fail on its placeholders: have flashinfer build its CUDA norm kernels instead.
[ -d .gpu/stubs/cutlass ] && export FLASHINFER_USE_CUDA_NORM=1
# A stand-in deep_gemm passes SGLang's DeepGEMM probe (an import), which would then route work to it.
[ -d .gpu/stubs/deep_gemm ] && export SGLANG_ENABLE_JIT_DEEPGEMM=0
# Under build/ (ignored, so never carried): a call that finds the machine still warm finds the sets
# the last call generated there (the trained set takes about three minutes to make).
export SGL_FIXTURE_DIR="${SGL_FIXTURE_DIR:-$PWD/build/sgl-fixtures}" SGL_TEST_LOG_DIR="$OUT/server-logs"
log "setup done in $(( $(date +%s) - t0 ))s; python $(python3 -c 'import sys; print(sys.version.split()[0])')"
# In the log, not a file of its own: at most 8 files come back.
nvidia-smi -L 2>&1 | tee -a "$OUT/run-on-device.log" >&2
imported=$(python3 -c "import sglang; print(sglang.__file__)") || { log "import sglang failed"; exit 2; }
case "$imported" in
  /tmp/sgltree/*) log "sglang: $imported" ;;
  *) log "refusing: sglang imported from $imported, not /tmp/sgltree"; exit 3 ;;
esac
for m in pytest matplotlib transformers; do
  python3 -c "import $m; print('$m', $m.__version__)" 2>&1 | tee -a "$OUT/run-on-device.log" >&2
done
t1=$(date +%s)
python3 -m bench fixtures || { log "fixture generation failed"; exit 2; }
log "fixtures ready in $(( $(date +%s) - t1 ))s"
# An interrupted bench needs up to ~30 s to stop its server and save: past 565 s the device's own
# 600-s limit kills it first and nothing is packed (2026-12-02: DEVICE_TIMEOUT=590 lost the logs' tgz).
# A step of ci/gpu/detach.sh's chain outlives the call and sets its own cap.
cap="${DEVICE_TIMEOUT_CAP:-565}"
if [ "${DEVICE_TIMEOUT:-560}" -gt "$cap" ]; then log "DEVICE_TIMEOUT=${DEVICE_TIMEOUT} leaves no time to stop and pack: using $cap"; DEVICE_TIMEOUT=$cap; fi
time_left() { echo $(( ${DEVICE_TIMEOUT:-560} - ($(date +%s) - t0) )); }  # seconds until DEVICE_TIMEOUT
budget=$(time_left)
case "$mode" in
  env) exit 0 ;;
  fixtures)
    # The trained sets take about three minutes to make: made in a call of their own, they are there
    # for the next calls while the machine stays warm (build/ is kept between calls).
    [ $# -gt 0 ] || { log "fixtures: name the presets to make (trained-gpu-bound, kimi-exact, ...)"; exit 2; }
    rc=0
    for preset in "$@"; do
      timeout --signal=INT --kill-after=30 "$(time_left)" python3 -m bench fixtures --preset "$preset" \
        || { rc=$?; log "$preset fixtures failed"; break; }
    done ;;
  test)
    timeout --signal=INT --kill-after=30 "$budget" python3 -m pytest tests/gpu -m gpu -rs -v -p no:cacheprovider \
      --junitxml="$OUT/junit.xml" "$@" 2>&1 | tee "$OUT/pytest.log"
    rc=${PIPESTATUS[0]}
    # At most 8 files come back; the whole suite writes more server logs than that.
    if [ -d "$OUT/server-logs" ]; then
      cp "$OUT/server-logs/summary.txt" "$OUT/" 2>/dev/null
      tar czf "$OUT/server-logs.tgz" -C "$OUT" server-logs && rm -rf "$OUT/server-logs"
    fi ;;
  bench)
    [ $# -gt 0 ] || set -- --quick
    timeout --signal=INT --kill-after=30 "$budget" python3 -m bench --out "$OUT/bench" "$@" 2>&1 | tee "$OUT/bench.log"
    rc=${PIPESTATUS[0]}
    # At most 8 files come back: keep results.json/.md, pack the server logs (which
    # `python -m bench report DIR --logs LOGDIR` reads) and redo the CSV and plot from results.json.
    # profiles/ (what --profile-at leaves: --keep-traces traces) is nested too deep to come back alone.
    packed=(logs); [ -d "$OUT/bench/profiles" ] && packed+=(profiles)
    [ -d "$OUT/bench/logs" ] && tar czf "$OUT/bench-logs.tgz" -C "$OUT/bench" "${packed[@]}" \
      && rm -rf "${packed[@]/#/$OUT/bench/}" "$OUT/bench/results.csv" "$OUT/bench"/*.png ;;
  bench-per-gpu|bench-seq)
    # Each sweep must hold its own baselines: ratios compare configs of one sweep only.
    # Generated once here, or each sweep would draw the same large fixture at once.
    for preset in $(printf '%s\n' "$@" | grep -o -- '--fixture-preset[ =][a-z-]*' | sed 's/.*[ =]//' | sort -u); do
      [ "$preset" = tiny ] || python3 -m bench fixtures --preset "$preset" || { log "$preset fixtures failed"; exit 2; }
    done
    sweep() {  # sweep I ARGS: one bench into $OUT/bench-I, its output in $OUT/bench-I.log
      local left; left=$(time_left)
      if [ "$left" -lt 60 ]; then
        echo "sweep $1 not started: ${left}s of DEVICE_TIMEOUT left" > "$OUT/bench-$1.log"; return 124
      fi
      local -a argv; eval "argv=($2)"  # ARGS is one shell word: its own quotes group its flags
      timeout --signal=INT --kill-after=30 "$left" python3 -m bench --out "$OUT/bench-$1" "${argv[@]}" > "$OUT/bench-$1.log" 2>&1
    }
    pids=(); rc=0
    for i in $(seq 0 $(( $# - 1 ))); do
      args="${@:$(( i + 1 )):1}"
      if [ "$mode" = bench-seq ]; then
        sweep "$i" "$args" || rc=$?
      else
        CUDA_VISIBLE_DEVICES=$i sweep "$i" "$args" &
        pids+=($!)
      fi
    done
    for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
    for i in $(seq 0 $(( $# - 1 ))); do
      tail -n 40 "$OUT/bench-$i.log" >&2
      # The device returns at most 8 files: with the log, two per sweep (results.json and the
      # rest packed), so three sweeps come back whole. The tables, the CSV and the plot can be
      # redone from results.json with `python -m bench report`.
      packed=$(cd "$OUT" && ls -d "bench-$i.log" "bench-$i/logs" "bench-$i/results.md" bench-$i/*.png 2>/dev/null)
      # shellcheck disable=SC2086
      tar czf "$OUT/logs-$i.tgz" -C "$OUT" $packed \
        && rm -rf "$OUT/bench-$i.log" "$OUT/bench-$i/logs" "$OUT/bench-$i/results.md" "$OUT/bench-$i/results.csv" "$OUT/bench-$i"/*.png
    done ;;
  *) log "unknown mode $mode (test | bench | bench-per-gpu | bench-seq | fixtures | env)"; exit 2 ;;
esac
log "exit $rc after $(( $(date +%s) - t0 ))s (124: interrupted at DEVICE_TIMEOUT)"
exit "$rc"
