# shellcheck shell=bash
# Qwen3-32B on 2 Atlas A3 nodes (2 x 16 dies = 16 cards). Sourced by ray_start_npu.sh on every node.
# Set MASTER_ADDR (the head's address) and, if the interface name differs per node, SOCKET_IFNAME.
export NNODES="${NNODES:-2}"
export NPUS_PER_NODE="${NPUS_PER_NODE:-16}"
# export MASTER_ADDR=10.0.0.1        # the head node, same value on every node
# export SOCKET_IFNAME=enp189s0f0    # default: the interface that routes to MASTER_ADDR
# export RAY_AUTH_TOKEN_PATH=~/.ray/auth_token   # a mode-600 copy of the head's token on each worker
export MODEL_PATH="${MODEL_PATH:-${MODELS_DIR:-$HOME/models}/Qwen3-32B}"
export DATA_DIR="${DATA_DIR:-$HOME/data}"
# Rollout hygiene (docs/onpolicy.md): rollout progress lines in the driver log (0 turns them off).
# The engine GC guard (automatic GC kept out of vLLM engine steps) is opt-in until a measurement shows a
# gain: in our replay it made the pause between steps worse (810 ms against 320 ms) and peak memory
# 1.73x; NPU_RL_ENGINE_GC=1 turns it on (tools/npu_acceptance.sh measures both).
export NPU_RL_ENGINE_GC="${NPU_RL_ENGINE_GC:-0}"
export NPU_RL_ROLLOUT_PROGRESS="${NPU_RL_ROLLOUT_PROGRESS:-1}"
