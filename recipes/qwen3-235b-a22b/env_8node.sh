# shellcheck shell=bash
# Qwen3-235B-A22B on 8 Atlas A3 nodes (8 x 16 dies = 64 cards). Sourced by ray_start_npu.sh on every node.
# Set MASTER_ADDR (the head's address) and, if the interface name differs per node, SOCKET_IFNAME.
export NNODES="${NNODES:-8}"
export NPUS_PER_NODE="${NPUS_PER_NODE:-16}"
# export MASTER_ADDR=10.0.0.1        # the head node, same value on every node
# export SOCKET_IFNAME=enp189s0f0    # default: the interface that routes to MASTER_ADDR
# export RAY_AUTH_TOKEN_PATH=~/.ray/auth_token   # a mode-600 copy of the head's token on each worker
export MODEL_PATH="${MODEL_PATH:-${MODELS_DIR:-$HOME/models}/Qwen3-235B-A22B}"
export DATA_DIR="${DATA_DIR:-$HOME/data}"
# Rollout hygiene (docs/onpolicy.md): automatic GC kept out of vLLM engine steps (bounded collection
# between steps), and rollout progress lines in the driver log. Set either to 0 to turn it off.
export NPU_RL_ENGINE_GC="${NPU_RL_ENGINE_GC:-1}"
export NPU_RL_ROLLOUT_PROGRESS="${NPU_RL_ROLLOUT_PROGRESS:-1}"
# Rollout rebalance (docs/rebalance.md; opt-in): our dispatcher picks the DP rank of every rollout
# request, longest predicted first, and lets all 32 x 256 slots fill (verl lets ~31 per rank reach vLLM):
# -11% to -15% generate time in simulation here, not yet measured live.
# export ROLLOUT_REBALANCE_ENABLE=1
