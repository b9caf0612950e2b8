#!/usr/bin/env bash
# The GPU work on the device machine, one step per call (docs/gpu_recipe.md).
#   bash bench/gpu_session.sh tests                 # the gpu-marked tests (pytest -m gpu)
#   bash bench/gpu_session.sh bench base [OPTS]     # bench/gpu_train.py for one model size, OPTS passed on
#   bash bench/gpu_session.sh train [OVERRIDES]     # python3 train.py experiment=multi30k_de_en_gpu OVERRIDES
#   bash bench/gpu_session.sh decode [OPTS]         # bench/gpu_decode.py on the averaged checkpoint of `train`
#   bash bench/gpu_session.sh valdecode [OPTS]      # bench/validation_decode.py on that checkpoint: the stages vs translate.py
#   bash bench/gpu_session.sh attention [OPTS]      # bench/gpu_attention.py: every mechanism, 1K to 16K
#   bash bench/gpu_session.sh loader                # bench/data_scale.py's loader with the pinned copy
# Needs, carried beside the checkout: .whl/ (hydra-core, omegaconf, antlr4-python3-runtime, datasets,
# dill, multiprocess: the wheels the machine's image lacks) and .gl/multi30k/ (the corpus files).
# The wheels go to /tmp/site, on PYTHONPATH: the image's CUDA torch and its packages stay as they are.
# Logs and results go to $OUT (what the device tool brings back; bench/results/ elsewhere).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
RUNS=/tmp/runs  # checkpoints stay on the machine (each ~90 MB); the runs' small files come back
if [ ! -f /tmp/site/.installed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || exit 1
  touch /tmp/site/.installed
  python3 -c "import torch, lightning, hydra, datasets, transformers; print('torch', torch.__version__, \
'lightning', lightning.__version__, 'hydra', hydra.__version__, 'datasets', datasets.__version__, \
'transformers', transformers.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() \
else 'no CUDA')" 2>&1 | grep -v Warning
  python3 -m pip show pyarrow fsspec huggingface-hub 2>/dev/null | grep -E '^(Name|Version)' | paste - - | tr '\n' ' '
  echo
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
fi
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export MULTI30K_DIR=${MULTI30K_DIR:-$PWD/.gl/multi30k} NMT_CACHE_DIR=/tmp/nmt-cache HF_HOME=/tmp/hf
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
step=${1:-}
shift
echo "== $step $* ($(date +%T))"
case $step in
  tests)
    python3 -m pytest -m gpu -rs -p no:cacheprovider tests/gpu "$@" 2>&1 | tee "$OUT/gpu_tests.log"
    ;;
  bench)
    size=${1:?bench needs a model size, e.g. base}
    shift
    tag=$size${1:+_$(echo "$*" | tr -dc 'a-z0-9' | cut -c1-12)}
    python3 bench/gpu_train.py --models "$size" --json "$OUT/gpu_train_$tag.json" "$@" 2>&1 \
      | tee "$OUT/gpu_train_$tag.log"
    ;;
  train)
    python3 train.py experiment=multi30k_de_en_gpu paths.runs_dir=$RUNS "$@" 2>&1 | tee "$OUT/train.log"
    for f in $RUNS/multi30k_de_en_gpu/*/{results.json,test.en.hyp,logs/metrics.csv,learning_curve.png}; do
      [ -f "$f" ] && cp "$f" "$OUT/"
    done
    ;;
  decode)
    ckpt=$(ls -t $RUNS/multi30k_de_en_gpu/*/checkpoints/averaged.ckpt 2>/dev/null | head -1)
    [ -n "$ckpt" ] || { echo "no averaged.ckpt under $RUNS: run the train step first" >&2; exit 1; }
    python3 bench/gpu_decode.py --checkpoint "$ckpt" --json "$OUT/gpu_decode.json" "$@" 2>&1 \
      | tee "$OUT/gpu_decode.log"
    ;;
  valdecode)
    ckpt=$(ls -t $RUNS/multi30k_de_en_gpu/*/checkpoints/averaged.ckpt 2>/dev/null | head -1)
    [ -n "$ckpt" ] || { echo "no averaged.ckpt under $RUNS: run the train step first" >&2; exit 1; }
    python3 bench/validation_decode.py --checkpoint "$ckpt" --device cuda --threads 16 \
      --json "$OUT/validation_decode.json" "$@" 2>&1 | tee "$OUT/validation_decode.log"
    ;;
  attention)
    python3 bench/gpu_attention.py --json "$OUT/gpu_attention.json" "$@" 2>&1 | tee "$OUT/gpu_attention.log"
    ;;
  loader)
    python3 bench/data_scale.py --pairs 200000 --loader-batches 100 --work-dir /tmp/data_scale "$@" 2>&1 \
      | tee "$OUT/loader.log"
    ;;
  *)
    echo "usage: bash bench/gpu_session.sh tests | bench base|big [OPTS] | train [OVERRIDES] | decode | valdecode | attention | loader" >&2
    exit 2
    ;;
esac
