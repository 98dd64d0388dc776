#!/usr/bin/env bash
# The CUDA path, on a machine with an NVIDIA GPU and the `smol` zoo built
# (python -m orchestrator zoo build --profile smol; where the machine reaches no registry,
# bench/gpu_bundle.py unpack puts it there). Each step runs even when an earlier one
# failed; its log, JSON and the sweep's database go to OUT_DIR (default runs/gpu), and the last
# line says which steps failed. Steps (default: all, in this order):
#   versions       the card and the software: nvidia-smi, torch / CUDA / NCCL / library versions
#   engine-bf16    bench/engine.py on SmolLM2 + zoo:smol/draft-s in bfloat16: t_target(n), our AR
#                  against transformers' generate(), static K against assisted generation,
#                  engine overhead
#   sweep          sweeps/gpu_smoke.yaml: a live sweep with an hf bfloat16 target and a DeepSpeed
#                  tp-1 float16 target over NCCL, stored in OUT_DIR/gpu-smoke.db, and its table
#   ds-steps       bench/deepspeed_steps.py: t_target(n) of SmolLM2 as a DeepSpeed tp-1 rank over
#                  NCCL in bfloat16, one-token steps plain and padded, the calibrated choice
#   kd-replay      sweeps/gpu_kd_replay.yaml: DistillSpec and AdaSPEC jobs through Ray Train on the
#                  GPU (NCCL), their drafts and draft-s in replay mode, stored in OUT_DIR/gpu-kd.db,
#                  with its jobs, trials and cost fit's cross-check
#   actors-bf16    bench/actors.py on the same pair in bfloat16: the Ray split against one process
#   actors-mps     the same under the CUDA MPS control daemon (started and stopped by the step;
#                  its log is OUT_DIR/mps-control.log): does one GPU context per process cause
#                  the split's cost on a shared GPU?
#   engine-fp16    bench/engine.py as engine-bf16, in float16
#   replicas       bench/gpu_replicas.py: gpu_smoke.yaml's hf pair with one replica (the default)
#                  and with two time-sharing the GPU, each sample's cost per token
#   warmup         bench/gpu_warmup.py: a fresh process's cost per token over its first 75 s
# Usage: bash bench/gpu_check.sh [OUT_DIR [STEP ...]]
# Environment: PYTHON (default python3), GPU_CHECK_SAMPLES (prompts, default 4),
# GPU_CHECK_TOKENS (new tokens per prompt, default 96).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/gpu}
shift || true
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(versions warmup engine-bf16 ds-steps sweep kd-replay actors-bf16 actors-mps engine-fp16 replicas)
py=${PYTHON:-python3}
samples=${GPU_CHECK_SAMPLES:-4}
tokens=${GPU_CHECK_TOKENS:-96}
pair=(--target zoo:smol/target --draft zoo:smol/draft-s --dataset humaneval)
mkdir -p "$out"
failed=()

run() {  # run NAME COMMAND...: log to OUT_DIR/NAME.log, remember a failure, show the log's end
  local name=$1
  shift
  echo "== $name: $*"
  local started=$SECONDS
  if "$@" >"$out/$name.log" 2>&1; then
    echo "   ok in $((SECONDS - started)) s"
  else
    echo "   FAILED (exit $?) in $((SECONDS - started)) s"
    failed+=("$name")
  fi
  tail -n 14 "$out/$name.log"
}

engine() {  # engine DTYPE
  run "engine-$1" "$py" bench/engine.py "${pair[@]}" --samples "$samples" \
    --max-new-tokens "$tokens" --device cuda --dtype "$1" --out "$out/engine-$1.json"
}

actors() {  # actors NAME: bench/actors.py on the pair in bfloat16 (ran past 110 s on an H200 with 2 repeats)
  run "$1" "$py" bench/actors.py "${pair[@]}" --samples "$samples" \
    --max-new-tokens "$tokens" --repeats 3 --device cuda --dtype bfloat16 --out "$out/$1.json"
}

for step in "${steps[@]}"; do
  case $step in
    versions)
      nvidia-smi >"$out/nvidia-smi.txt" 2>&1
      run versions "$py" -c "
import torch, transformers, ray, deepspeed
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())
print('gpu', torch.cuda.get_device_name(0), 'count', torch.cuda.device_count())
print('transformers', transformers.__version__, 'ray', ray.__version__, 'deepspeed', deepspeed.__version__)"
      ;;
    engine-bf16) engine bfloat16 ;;
    engine-fp16) engine float16 ;;
    sweep)
      run sweep "$py" -m orchestrator submit sweeps/gpu_smoke.yaml \
        --db "sqlite:///$out/gpu-smoke.db" --yes --no-progress
      run sweep-table "$py" -m orchestrator query --db "sqlite:///$out/gpu-smoke.db" "
        SELECT pair, temperature AS temp, policy, round(tokens_per_s, 1) AS tok_s,
               round(speedup, 3) AS speedup, round(speedup_low, 3) AS lo,
               round(speedup_high, 3) AS hi, round(acceptance_rate, 3) AS acc
        FROM trials WHERE status = 'done' ORDER BY pair, temperature, policy"
      ;;
    ds-steps)
      run ds-steps "$py" bench/deepspeed_steps.py --target zoo:smol/target --ranks 1 \
        --dtype bfloat16 --out "$out/ds-steps.json"
      ;;
    kd-replay)
      run kd-replay "$py" -m orchestrator submit sweeps/gpu_kd_replay.yaml \
        --db "sqlite:///$out/gpu-kd.db" --yes --no-progress
      kd_db=(--db "sqlite:///$out/gpu-kd.db")
      run kd-replay-jobs "$py" -m orchestrator query "${kd_db[@]}" "
        SELECT name, kind, status, round(seconds, 1) AS s FROM training_jobs ORDER BY name"
      run kd-replay-trials "$py" -m orchestrator query "${kd_db[@]}" "
        SELECT pair, policy, threshold AS thr, max_draft_len AS k, mode,
               round(tokens_per_s, 1) AS tok_s, round(speedup, 3) AS speedup,
               round(speedup_low, 3) AS lo, round(speedup_high, 3) AS hi,
               round(acceptance_rate, 3) AS acc
        FROM trials WHERE status = 'done' ORDER BY pair, mode, policy, k, thr"
      run kd-replay-check "$py" -m orchestrator query "${kd_db[@]}" "
        SELECT pair, round(check_same_rounds, 3) AS same_rounds,
               round(check_tokens_per_s, 1) AS live,
               round(check_projected_tokens_per_s, 1) AS projected,
               round(r2_round, 3) AS r2, round(run_r2, 3) AS run_r2 FROM cost_fits"
      ;;
    actors-bf16) actors actors-bf16 ;;
    actors-mps)
      export CUDA_MPS_PIPE_DIRECTORY=/tmp/specsweep-mps CUDA_MPS_LOG_DIRECTORY=/tmp/specsweep-mps-log
      mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
      if nvidia-cuda-mps-control -d; then
        actors actors-mps
        echo quit | nvidia-cuda-mps-control
        sleep 3
        cp "$CUDA_MPS_LOG_DIRECTORY/control.log" "$out/mps-control.log" 2>/dev/null
      else
        echo "== actors-mps: the MPS control daemon did not start"
        failed+=(actors-mps)
      fi
      unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
      ;;
    warmup)
      run warmup "$py" bench/gpu_warmup.py --target zoo:smol/target --device cuda \
        --dtype bfloat16 --out "$out/warmup.json"
      ;;
    replicas)
      run replicas "$py" bench/gpu_replicas.py sweeps/gpu_smoke.yaml --out "$out/replicas.json"
      ;;
    *) echo "unknown step $step (have: versions warmup engine-bf16 ds-steps sweep kd-replay actors-bf16 actors-mps engine-fp16 replicas)"
       exit 2 ;;
  esac
done
if [ ${#failed[@]} -eq 0 ]; then
  echo "gpu_check: ${steps[*]}: all passed; outputs in $out"
else
  echo "gpu_check: failed steps: ${failed[*]}; outputs in $out"
  exit 1
fi
