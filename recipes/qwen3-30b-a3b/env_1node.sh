# shellcheck shell=bash
# Qwen3-30B-A3B on one Atlas A3 node (16 dies). Sourced by ray_start_npu.sh.
export NNODES="${NNODES:-1}"
export NPUS_PER_NODE="${NPUS_PER_NODE:-16}"
export MODEL_PATH="${MODEL_PATH:-${MODELS_DIR:-$HOME/models}/Qwen3-30B-A3B}"
export DATA_DIR="${DATA_DIR:-$HOME/data}"
# Rollout hygiene (docs/onpolicy.md): rollout progress lines in the driver log (0 turns them off).
# The engine GC guard (automatic GC kept out of vLLM engine steps) is opt-in until a measurement shows a
# gain: in our replay it made the pause between steps worse (810 ms against 320 ms) and peak memory
# 1.73x; NPU_RL_ENGINE_GC=1 turns it on (tools/npu_acceptance.sh measures both).
export NPU_RL_ENGINE_GC="${NPU_RL_ENGINE_GC:-0}"
export NPU_RL_ROLLOUT_PROGRESS="${NPU_RL_ROLLOUT_PROGRESS:-1}"
