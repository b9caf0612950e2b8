#!/usr/bin/env bash
# Every benchmark of BENCHMARKS.md, in order of importance, each log under bench/results/.
#   bash bench/run_all.sh            # waits until no Multi30k training has run for 90 s, then measures
# Timings need the whole machine: the script waits for `train.py experiment=multi30k*` to be gone
# (and to stay gone for 90 s, so that the gap between two training runs is not mistaken for the end).
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/results

wait_for_quiet() {
  local quiet=0
  while [ "$quiet" -lt 90 ]; do
    if pgrep -f "train.py experiment=multi30k" >/dev/null; then quiet=0; else quiet=$((quiet + 10)); fi
    sleep 10
  done
}

step() {  # step NAME COMMAND...: run one benchmark after the machine is quiet, log it
  local name=$1
  shift
  wait_for_quiet
  echo "== $(date +%T) $name: $*"
  "$@" >"bench/results/$name.log" 2>&1
  echo "   $(date +%T) exit $? -> bench/results/$name.log"
}

step train_speed python3 bench/train_speed.py
step decode_speed python3 bench/decode_speed.py
step quality python3 bench/quality.py --collect
step decode_profile python3 bench/decode_speed.py --profile
step train_profile python3 bench/train_speed.py --profile
step decode_compile python3 bench/decode_speed.py --workloads random --compile --bf16 --reps 2 --slow-reps 0 --json decode_compile
step train_workers python3 bench/train_speed.py --rounds 6 --workers 2 --worker-rounds 6 --json train_workers
