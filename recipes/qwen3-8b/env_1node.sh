# shellcheck shell=bash
# Qwen3-8B on one node. NPUS_PER_NODE defaults to the dies this node has (16 on an A3 node).
export NNODES="${NNODES:-1}"
export MODEL_PATH="${MODEL_PATH:-${MODELS_DIR:-$HOME/models}/Qwen3-8B}"
export DATA_DIR="${DATA_DIR:-$HOME/data}"
