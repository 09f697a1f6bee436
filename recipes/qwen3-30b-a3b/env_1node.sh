# shellcheck shell=bash
# Qwen3-30B-A3B on one Atlas A3 node (16 dies). Sourced by ray_start_npu.sh.
export NNODES="${NNODES:-1}"
export NPUS_PER_NODE="${NPUS_PER_NODE:-16}"
export MODEL_PATH="${MODEL_PATH:-${MODELS_DIR:-$HOME/models}/Qwen3-30B-A3B}"
export DATA_DIR="${DATA_DIR:-$HOME/data}"
