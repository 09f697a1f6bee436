# shellcheck shell=bash
# Qwen3-30B-A3B on one Atlas A3 node (16 dies). Sourced by ray_start_npu.sh.
export NNODES="${NNODES:-1}"
export NPUS_PER_NODE="${NPUS_PER_NODE:-16}"
export MODEL_PATH="${MODEL_PATH:-${MODELS_DIR:-$HOME/models}/Qwen3-30B-A3B}"
export DATA_DIR="${DATA_DIR:-$HOME/data}"
# Rollout hygiene (docs/onpolicy.md): automatic GC kept out of vLLM engine steps (bounded collection
# between steps), and rollout progress lines in the driver log. Set either to 0 to turn it off.
export NPU_RL_ENGINE_GC="${NPU_RL_ENGINE_GC:-1}"
export NPU_RL_ROLLOUT_PROGRESS="${NPU_RL_ROLLOUT_PROGRESS:-1}"
