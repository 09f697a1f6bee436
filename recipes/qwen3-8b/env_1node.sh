# shellcheck shell=bash
# Qwen3-8B on one node. NPUS_PER_NODE defaults to the dies this node has (16 on an A3 node).
export NNODES="${NNODES:-1}"
export MODEL_PATH="${MODEL_PATH:-${MODELS_DIR:-$HOME/models}/Qwen3-8B}"
export DATA_DIR="${DATA_DIR:-$HOME/data}"
# Rollout hygiene (docs/onpolicy.md): rollout progress lines in the driver log (0 turns them off).
# The engine GC guard (automatic GC kept out of vLLM engine steps) is opt-in until a measurement shows a
# gain: in our replay it made the pause between steps worse (810 ms against 320 ms) and peak memory
# 1.73x; NPU_RL_ENGINE_GC=1 turns it on (tools/npu_acceptance.sh measures both).
export NPU_RL_ENGINE_GC="${NPU_RL_ENGINE_GC:-0}"
export NPU_RL_ROLLOUT_PROGRESS="${NPU_RL_ROLLOUT_PROGRESS:-1}"
