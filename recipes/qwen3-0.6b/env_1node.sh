# shellcheck shell=bash
# Qwen3-0.6B smoke run on one node. NPUS_PER_NODE defaults to the dies this node has.
export NNODES="${NNODES:-1}"
export MODEL_PATH="${MODEL_PATH:-${MODELS_DIR:-$HOME/models}/Qwen3-0.6B}"
export DATA_DIR="${DATA_DIR:-$HOME/data}"
