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
# Rollout hygiene (docs/onpolicy.md): rollout progress lines in the driver log (0 turns them off).
# The engine GC guard (automatic GC kept out of vLLM engine steps) is opt-in until a measurement shows a
# gain: in our replay it made the pause between steps worse (810 ms against 320 ms) and peak memory
# 1.73x; NPU_RL_ENGINE_GC=1 turns it on (tools/npu_acceptance.sh measures both).
export NPU_RL_ENGINE_GC="${NPU_RL_ENGINE_GC:-0}"
export NPU_RL_ROLLOUT_PROGRESS="${NPU_RL_ROLLOUT_PROGRESS:-1}"
# Rollout rebalance (docs/rebalance.md; opt-in): our dispatcher picks the DP rank of every rollout
# request, longest predicted first, and lets all 32 x 256 slots fill (verl lets ~31 per rank reach vLLM):
# -11% to -15% generate time in simulation here, not yet measured live.
# export ROLLOUT_REBALANCE_ENABLE=1
# Rollout fast path for the MoE (docs/fast_path.md):
# - HCCL_BUFFSIZE (MB): vllm-ascend's MC2 dispatch/combine group sizes its buffer from it alone
#   (vllm_ascend/utils.py, get_hccl_config_for_pg_options); its own Qwen3-235B configs use 1024. Every
#   HCCL group of the trainer takes it too, so 512 here: raise it if the rollout logs an MC2 buffer error.
# - jemalloc for the host allocations of the trainer and the rollout (vllm-ascend's images preload it);
#   the Docker image installs it at this path. Only preloaded where the file exists.
export HCCL_BUFFSIZE="${HCCL_BUFFSIZE:-512}"
NPU_RL_JEMALLOC="${NPU_RL_JEMALLOC:-/usr/lib64/libjemalloc.so.2}"
if [[ -f "$NPU_RL_JEMALLOC" && ":${LD_PRELOAD:-}:" != *":$NPU_RL_JEMALLOC:"* ]]; then
    export LD_PRELOAD="$NPU_RL_JEMALLOC${LD_PRELOAD:+:$LD_PRELOAD}"
fi
