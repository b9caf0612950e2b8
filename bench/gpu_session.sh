#!/usr/bin/env bash
# Issue 13's GPU work on the device machine, one step per call (BENCHMARKS.md, "GPU recipe").
#   bash bench/gpu_session.sh tests          # the gpu-marked tests (pytest -m gpu)
#   bash bench/gpu_session.sh bench base     # bench/gpu_train.py for one model size (base or big)
#   bash bench/gpu_session.sh train          # python3 train.py experiment=multi30k_de_en_gpu
# Needs, carried beside the checkout: .whl/ (hydra-core, omegaconf, antlr4-python3-runtime, datasets,
# dill, multiprocess: the wheels the machine's image lacks) and .gl/multi30k/ (the corpus files).
# The wheels go to /tmp/site, on PYTHONPATH: the image's CUDA torch and its packages stay as they are.
# Logs and results go to $OUT (what the device tool brings back; bench/results/ elsewhere).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export MULTI30K_DIR=${MULTI30K_DIR:-$PWD/.gl/multi30k} NMT_CACHE_DIR=/tmp/nmt-cache HF_HOME=/tmp/hf
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
python3 -c "import torch, lightning, hydra, datasets; print('torch', torch.__version__, 'lightning', \
lightning.__version__, 'hydra', hydra.__version__, 'datasets', datasets.__version__, \
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA')" || exit 1
python3 -m pip show pyarrow fsspec huggingface-hub 2>/dev/null | grep -E '^(Name|Version)' | paste - - | tr '\n' ' '
echo
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
case ${1:-} in
  tests)
    python3 -m pytest -m gpu -rs -p no:cacheprovider tests/gpu 2>&1 | tee "$OUT/gpu_tests.log"
    ;;
  bench)
    size=${2:?bench needs a model size, e.g. base}
    python3 bench/gpu_train.py --models "$size" --json "$OUT/gpu_train_$size.json" 2>&1 \
      | tee "$OUT/gpu_train_$size.log"
    ;;
  train)
    # Checkpoints stay on the machine (each ~90 MB); the run's small files come back.
    python3 train.py experiment=multi30k_de_en_gpu paths.runs_dir=/tmp/runs 2>&1 | tee "$OUT/train.log"
    for f in /tmp/runs/multi30k_de_en_gpu/*/{results.json,config.yaml,test.en.hyp,logs/metrics.csv,learning_curve.png}; do
      [ -f "$f" ] && cp "$f" "$OUT/"
    done
    ;;
  *)
    echo "usage: bash bench/gpu_session.sh tests | bench base|big | train" >&2
    exit 2
    ;;
esac
