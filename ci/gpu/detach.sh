#!/bin/bash
# A chain of device runs longer than one call's 10 minutes, on one machine kept warm:
#   bash ci/gpu/detach.sh start SECONDS "MODE ARGS" ["MODE ARGS" ...]
#   bash ci/gpu/detach.sh wait [SECONDS]
# `start` copies the checkout (.gpu included, build/ left out) to $DETACH_DIR/repo and runs there,
# one after another, `run-on-device.sh MODE ARGS` for each step, in a process session of its own that
# outlives the call. The steps share SECONDS: each gets what the earlier ones left as its
# DEVICE_TIMEOUT, and one with less than a minute left is not started. The steps share the copy's
# build/, so a first `fixtures` step makes the trained set for the rest. `start` then waits as
# `wait` does. `wait` returns when the chain has ended or after SECONDS (default 540), with each
# finished step's files (what run-on-device.sh wrote to its $OUT, and its log) packed in
# $OUT/step-<i>.tgz and the chain's log in $OUT/chain.log. Call `wait` again within the device's
# idle release (about 30 s) of the reply, or the machine goes back with the chain.
set -uo pipefail
cd "$(dirname "$0")/../.."
export DETACH_DIR="${DETACH_DIR:-/tmp/detached}"
export DETACH_RUNNER="${DETACH_RUNNER:-ci/gpu/run-on-device.sh}"  # relative to the checkout's copy
OUT="${OUT:-$PWD/build/device-out}"
chain_log="$DETACH_DIR/chain.log"
say() { echo "[detach $(date -u +%H:%M:%S)] $*" >> "$chain_log"; }

run_chain() {  # SECONDS STEP...: runs in its own session; writes only under $DETACH_DIR
  local deadline=$(( $(date +%s) + $1 )) cap=$1 i=0 left rc spec
  shift
  local -a argv
  for spec in "$@"; do
    left=$(( deadline - $(date +%s) ))
    if [ "$left" -lt 60 ]; then
      say "step $i not started, ${left}s left: $spec"
    else
      say "step $i started, ${left}s left: $spec"
      eval "argv=($spec)"  # one shell word a step: its own quotes group its arguments
      mkdir -p "$DETACH_DIR/step-$i"
      (cd "$DETACH_DIR/repo" && OUT="$DETACH_DIR/step-$i" DEVICE_TIMEOUT="$left" DEVICE_TIMEOUT_CAP="$cap" \
        bash "$DETACH_RUNNER" "${argv[@]}") > "$DETACH_DIR/step-$i.log" 2>&1
      rc=$?
      echo "$rc" > "$DETACH_DIR/step-$i.rc"
      say "step $i exit $rc"
    fi
    i=$(( i + 1 ))
  done
  say "chain done"
  touch "$DETACH_DIR/done"
}

wait_chain() {  # [SECONDS]
  local end=$(( $(date +%s) + ${1:-540} )) rc step status=1  # status: 0 once the chain has ended
  while [ ! -f "$DETACH_DIR/done" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 1; done
  # Decided once: the chain may end while this call packs, and the reply must match the exit code.
  [ -f "$DETACH_DIR/done" ] && status=0
  [ "$status" -eq 0 ] || say "still running (the next wait call picks it up)"
  mkdir -p "$OUT"
  for rc in "$DETACH_DIR"/step-*.rc; do
    [ -f "$rc" ] || continue
    step=$(basename "$rc" .rc)
    tar czf "$OUT/$step.tgz" -C "$DETACH_DIR" "$step" "$step.log" "$step.rc"
  done
  cp "$chain_log" "$OUT/chain.log"
  cat "$chain_log"
  # The step in flight, for the reply's tail.
  step=$(ls -t "$DETACH_DIR"/step-*.log 2>/dev/null | head -n 1)
  [ -n "$step" ] && tail -n 15 "$step"
  return "$status"
}

case "${1:-}" in
  start)
    [ $# -ge 3 ] && [[ "$2" =~ ^[0-9]+$ ]] || { echo "usage: $0 start SECONDS \"MODE ARGS\" [...]" >&2; exit 2; }
    if [ -d "$DETACH_DIR" ] && [ ! -f "$DETACH_DIR/done" ]; then
      echo "a chain is running in $DETACH_DIR: wait for it ($0 wait)" >&2; exit 2
    fi
    rm -rf "$DETACH_DIR" && mkdir -p "$DETACH_DIR/repo"
    tar cf - --exclude=./build . | tar xf - -C "$DETACH_DIR/repo"
    touch "$chain_log"
    setsid nohup bash "$DETACH_DIR/repo/ci/gpu/detach.sh" _chain "${@:2}" > /dev/null 2>&1 < /dev/null &
    wait_chain ;;
  _chain) shift; run_chain "$@" ;;
  wait)
    [ -d "$DETACH_DIR" ] || { echo "no chain in $DETACH_DIR: start one ($0 start)" >&2; exit 2; }
    wait_chain "${2:-540}" ;;
  *) echo "usage: $0 start SECONDS \"MODE ARGS\" [...] | wait [SECONDS]" >&2; exit 2 ;;
esac
