# shellcheck shell=bash
# Qwen3-0.6B smoke run on one node. NPUS_PER_NODE defaults to the dies this node has.
export NNODES="${NNODES:-1}"
export MODEL_PATH="${MODEL_PATH:-${MODELS_DIR:-$HOME/models}/Qwen3-0.6B}"
export DATA_DIR="${DATA_DIR:-$HOME/data}"
# Rollout hygiene (docs/onpolicy.md): automatic GC kept out of vLLM engine steps (bounded collection
# between steps), and rollout progress lines in the driver log. Set either to 0 to turn it off.
export NPU_RL_ENGINE_GC="${NPU_RL_ENGINE_GC:-1}"
export NPU_RL_ROLLOUT_PROGRESS="${NPU_RL_ROLLOUT_PROGRESS:-1}"
