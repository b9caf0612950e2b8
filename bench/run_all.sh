#!/usr/bin/env bash
# Every benchmark of BENCHMARKS.md, in order of importance, each log under bench/results/.
#   bash bench/run_all.sh            # waits until no Multi30k training has run for 2 minutes, then measures
# Timings need the whole machine: the script waits for `train.py experiment=multi30k*` to be gone
# (and to stay gone for 2 minutes, so that the gap between two training runs is not mistaken for the
# end). A benchmark during which such a training starts is stopped at once (its timings would be
# wrong and it would slow the training) and run again once the machine is quiet.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/results
QUIET_S=${QUIET_S:-120}
DEADLINE=${DEADLINE:-}  # e.g. DEADLINE=23:30: start no benchmark after that time of day
SKIP=${SKIP:-}  # e.g. SKIP="train_speed quality": benchmarks not to run

training() { pgrep -f "train.py experiment=multi30k" >/dev/null; }

QUIET_SEEN=0  # 1 once the machine has been quiet for QUIET_S and no training was seen since

wait_for_quiet() {
  if [ "$QUIET_SEEN" = 1 ] && ! training; then return; fi
  local quiet=0
  while [ "$quiet" -lt "$QUIET_S" ]; do
    if training; then quiet=0; else quiet=$((quiet + 10)); fi
    sleep 10
  done
  QUIET_SEEN=1
}

step() {  # step NAME LIMIT_S COMMAND...: run one benchmark on a quiet machine, log it
  local name=$1 limit=$2
  shift 2
  case " $SKIP " in *" $name "*) return ;; esac
  while true; do
    wait_for_quiet
    if [ -n "$DEADLINE" ] && [ "$(date +%s)" -gt "$(date -d "$DEADLINE" +%s)" ]; then
      echo "   $(date +%T) past $DEADLINE: $name not run"
      return
    fi
    echo "== $(date +%T) $name: $*"
    setsid timeout "$limit" "$@" >"bench/results/$name.log" 2>&1 &
    local pid=$!
    while kill -0 "$pid" 2>/dev/null; do
      if training; then
        QUIET_SEEN=0
        kill -- "-$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        echo "   $(date +%T) training started: $name stopped, will run again"
        continue 2
      fi
      sleep 5
    done
    wait "$pid"
    echo "   $(date +%T) exit $? -> bench/results/$name.log"
    return
  done
}

step train_speed 600 python3 bench/train_speed.py
step decode_speed 1200 python3 bench/decode_speed.py
step export 600 python3 bench/export.py
step quality 120 python3 bench/quality.py --collect
step decode_profile 240 python3 bench/decode_speed.py --profile
step train_profile 240 python3 bench/train_speed.py --profile
step decode_compile 420 python3 bench/decode_speed.py --workloads random --compile --bf16 --reps 2 --slow-reps 0 --json decode_compile
step train_workers 420 python3 bench/train_speed.py --rounds 6 --workers 2 --worker-rounds 6 --json train_workers
step inductor_cpu 300 python3 bench/inductor_cpu.py
