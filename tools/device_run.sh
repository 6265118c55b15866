#!/usr/bin/env bash
# The prepared run for a lent GPU machine: one command, inside one device call.
#
#   bash tools/device_run.sh RUN SECONDS [OUT]
#
# RUN holds the datasets (and any checkpoints to resume) of the darkroom families at the DPT
# recipe, made here by `pipelines/generate_data.py` (RECIPE below; the GPU machine has no Ray,
# so nothing there generates data); SECONDS is the wall time the whole command may take.
#  1. the population benchmark on the GPU (benchmarks/bench_population.py, at most 100 s);
#  2. every model of darkroom, darkroom_region and darkroom_continuous at the DPT recipe, one
#     process per population (8: a population is one kind and config, its seeds) (tools/population_train.py), side by side, each stopping at the
#     first epoch end past the deadline with its checkpoints written (the same command
#     resumes them: a longer training resumes from a shorter one's checkpoints);
#  3. OUT (default $OUT) gets the logs and the checkpoints packed into 15 MB parts: every
#     model's newest checkpoint, and the main SPICE models' earlier ones (what the read-out
#     chooses the step budget from). Unpack with `cat OUT/ckpt.tgz.* | tar xz`.
set -u
RUN=${1:?usage: tools/device_run.sh RUN SECONDS [OUT]}
SECONDS_ALLOWED=${2:?usage: tools/device_run.sh RUN SECONDS [OUT]}
OUT=${3:-${OUT:?no OUT given and none in the environment}}
# DEVICE, RECIPE_ARGS, BENCH_MODELS, BENCH=0 and POPULATIONS ("experiment kind variant;...")
# change the device, the training settings, the benchmark's population sizes (or skip it) and
# what trains (a CPU rehearsal: DEVICE=cpu RECIPE_ARGS="--preset smoke").
DEVICE=${DEVICE:-cuda}
if [ -n "${RECIPE_ARGS:-}" ]; then read -r -a RECIPE <<< "$RECIPE_ARGS"; else
RECIPE=(--set data.num_train_tasks=80000 --set train.batch_size=64 --set model.n_layer=4
        --set model.n_embd=32 --set train.epochs=200 --set train.checkpoint_every=3); fi
T0=$(date +%s)
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
left() { echo $(( SECONDS_ALLOWED - ($(date +%s) - T0) )); }
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__)'
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

[ "${BENCH:-1}" = 1 ] && timeout 100 python3 benchmarks/bench_population.py --device "$DEVICE" --threads 1 \
    --models ${BENCH_MODELS:-1 3 8 24 48} --steps 5 --rounds 2 > "$OUT/bench.txt" 2>&1
echo "benchmark: exit $?, $(left) s left"; tail -25 "$OUT/bench.txt"

# one process per population, side by side: the GPU is launch-bound at these sizes
STOP=$(( $(left) - 150 ))
HARD=$(( $(left) - 40 ))
echo "training: --stop-after $STOP s, killed at $HARD s"
pids=()
POPULATIONS=${POPULATIONS:-"darkroom spice main;darkroom spice none;darkroom spice adv;\
darkroom spice epi;darkroom dpt main;darkroom_region spice main;darkroom_continuous spice main;\
darkroom_continuous dpt main"}
IFS=';' read -r -a SPECS <<< "$POPULATIONS"
for spec in "${SPECS[@]}"; do
  set -- $spec
  timeout "$HARD" python3 tools/population_train.py "$RUN" --experiments "$1" --kinds "$2" \
      --variants "$3" "${RECIPE[@]}" --device "$DEVICE" --stop-after "$STOP" \
      > "$OUT/train-$1-$2-$3.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; echo "population job $pid: exit $?"; done
grep -h "population of\|stopped after\|error\|Error" "$OUT"/train-*.log | tail -30

# pack: every model's newest checkpoint, and the SPICE models' earlier ones
LIST=$(mktemp)
for model in "$RUN"/checkpoints/*/*-seed*; do
  ls -d "$model"/local/epoch-* 2>/dev/null | tail -1
  # the main SPICE models (all three weights on): every earlier checkpoint too
  if [[ $(basename "$model") == spice-* ]] && grep -q "use_adv: true" "$model/config.yaml" \
      && grep -q "use_epi: true" "$model/config.yaml"; then ls -d "$model"/local/epoch-* 2>/dev/null | head -n -1; fi
done > "$LIST"
tar czf - -T "$LIST" | split -b 15M - "$OUT/ckpt.tgz."
echo "packed $(wc -l < "$LIST") checkpoints: $(du -ch "$OUT"/ckpt.tgz.* | tail -1)"
echo "done in $(( $(date +%s) - T0 )) s"
