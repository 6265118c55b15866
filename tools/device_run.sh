#!/usr/bin/env bash
# The prepared run for a lent GPU machine: one command, inside one device call.
#
#   bash tools/device_run.sh RUN SECONDS [OUT]
#
# RUN holds the datasets (and any checkpoints to resume) of the darkroom families at the DPT
# recipe, made here by `pipelines/generate_data.py` (RECIPE below; the GPU machine has no Ray,
# so nothing there generates data); SECONDS is the wall time the whole command may take.
#  1. the population benchmark on the GPU (benchmarks/bench_population.py, at most 100 s),
#     eager and captured (CUDA graph) steps, and its check that the captured step trains the
#     same weights as the eager one: training captures its steps only if that check passed;
#     then the stacked-rollout benchmark (benchmarks/bench_stacked_eval.py, at most 60 s):
#     a tuning grid's points stepped as one batch against one rollout per point;
#  2. the main SPICE models of darkroom, darkroom_region and darkroom_continuous at the DPT
#     recipe (EXPERIMENTS, KINDS, VARIANTS below), as populations (one kind, config and
#     resume epoch each) stepped in turn in one process, each stopping at the first epoch end
#     past the deadline with its checkpoints written (the same command resumes them: a longer
#     training resumes from a shorter one's checkpoints);
#  3. OUT (default $OUT) gets bench.txt (the machine and the benchmark), train.log (the
#     training's log) and the checkpoints packed into 15 MB parts: every model's newest
#     checkpoint whole, and the main SPICE models' earlier ones weights-only (what the
#     read-out chooses the step budget from, and a study's final), thinned to fit PACK_MB.
#     Unpack with `cat OUT/ckpt.tgz.* | tar xz`.
set -u
RUN=${1:?usage: tools/device_run.sh RUN SECONDS [OUT]}
SECONDS_ALLOWED=${2:?usage: tools/device_run.sh RUN SECONDS [OUT]}
OUT=${3:-${OUT:?no OUT given and none in the environment}}
# DEVICE, RECIPE_ARGS, BENCH_MODELS, BENCH=0, FORCE_GRAPH=on|off and EXPERIMENTS, KINDS,
# VARIANTS (comma-separated, as tools/population_train.py takes them) change the device, the
# training settings, the benchmark's population sizes (or skip it), the capture decision and
# what trains (a CPU rehearsal: DEVICE=cpu RECIPE_ARGS="--preset smoke").
EXPERIMENTS=${EXPERIMENTS:-darkroom,darkroom_region,darkroom_continuous}
KINDS=${KINDS:-spice}
VARIANTS=${VARIANTS:-main}
DEVICE=${DEVICE:-cuda}
if [ -n "${RECIPE_ARGS:-}" ]; then read -r -a RECIPE <<< "$RECIPE_ARGS"; else
RECIPE=(--set data.num_train_tasks=80000 --set train.batch_size=64 --set model.n_layer=4
        --set model.n_embd=32 --set train.epochs=200 --set train.checkpoint_every=2); fi
T0=$(date +%s)
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
left() { echo $(( SECONDS_ALLOWED - ($(date +%s) - T0) )); }
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__)'
} > "$OUT/bench.txt" 2>&1

GRAPH=off
if [ "${BENCH:-1}" = 1 ]; then
  timeout 100 python3 benchmarks/bench_population.py --device "$DEVICE" --threads 1 \
      --experiments darkroom bandit --models ${BENCH_MODELS:-1 3 24 48} --steps 5 --rounds 2 \
      >> "$OUT/bench.txt" 2>&1
  echo "benchmark: exit $?, $(left) s left" | tee -a "$OUT/bench.txt"
  # captured steps train only where the benchmark saw them give the eager step's weights
  grep -q "graph check ok" "$OUT/bench.txt" && ! grep -q "graph check FAILED" "$OUT/bench.txt" \
      && GRAPH=on
fi
if [ "${BENCH:-1}" = 1 ]; then  # tuning rollouts: a grid's points as one batch (at most 60 s)
  timeout 60 python3 benchmarks/bench_stacked_eval.py --device "$DEVICE" --points 1 16 64 \
      --tasks 200 >> "$OUT/bench.txt" 2>&1
  echo "stacked rollouts: exit $?, $(left) s left" | tee -a "$OUT/bench.txt"
fi
GRAPH=${FORCE_GRAPH:-$GRAPH}
cat "$OUT/bench.txt"

# every population in one process, a step of each in turn (a process per population
# time-slices the GPU: three captured populations side by side ran at about one's rate). An
# eager epoch at the recipe takes about 40 s per population, a captured one a few seconds:
# the margin for the last epoch
if [ "$GRAPH" = on ]; then MARGIN=60; else MARGIN=150; fi
STOP=$(( $(left) - MARGIN ))
HARD=$(( $(left) - 25 ))
echo "training: captured steps $GRAPH, --stop-after $STOP s, killed at $HARD s"
timeout "$HARD" python3 tools/population_train.py "$RUN" --experiments "$EXPERIMENTS" \
    --kinds "$KINDS" --variants "$VARIANTS" "${RECIPE[@]}" --device "$DEVICE" \
    --stop-after "$STOP" --graph "$GRAPH" > "$OUT/train.log" 2>&1
echo "training: exit $?" | tee -a "$OUT/train.log"
grep -h "population of\|stopped after\|error\|Error" "$OUT/train.log" | tail -40

# pack: every model's newest checkpoint whole; the main SPICE models' earlier ones made
# weights-only (spice_ray.model.checkpoint.drop_optimizer: they still load and settle as a
# final, at a third of the size), thinned evenly to fit PACK_MB
LIST=$(mktemp)
python3 - "$RUN" "${PACK_MB:-56}" > "$LIST" <<'PY'
import sys, math
from pathlib import Path
from spice_ray.model.checkpoint import drop_optimizer
run, budget = Path(sys.argv[1]), float(sys.argv[2]) * 1e6
newest, earlier = [], []
for model in sorted(run.glob("checkpoints/*/*-seed*")):
    epochs = sorted(model.glob("local/epoch-*"))
    if not epochs:
        continue
    newest += [p for p in epochs[-1].iterdir()]
    cfg = (model / "config.yaml").read_text() if (model / "config.yaml").exists() else ""
    if model.name.startswith("spice-") and "use_adv: true" in cfg and "use_epi: true" in cfg:
        earlier.append(epochs[:-1])
size = lambda files: sum(p.stat().st_size for p in files)
weights = lambda e: [p for p in e.iterdir() if not p.name.startswith("optimizer")]
room = budget - size(newest)
total = sum(size(weights(e)) for m in earlier for e in m)
keep = 1 if total <= room else max(1, math.ceil(total / max(room, 1.0)))
for p in newest:
    print(p)
for m in earlier:  # every keep-th, counted back from the newest
    for e in m[::-1][keep - 1::keep]:
        for p in drop_optimizer(e).iterdir():
            print(p)
PY
tar czf - -T "$LIST" | split -b 15M - "$OUT/ckpt.tgz."
echo "packed $(wc -l < "$LIST") files: $(du -ch "$OUT"/ckpt.tgz.* | tail -1)"
echo "done in $(( $(date +%s) - T0 )) s"
