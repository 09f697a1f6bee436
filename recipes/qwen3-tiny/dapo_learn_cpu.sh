#!/usr/bin/env bash
# DAPO that learns, on CPU (issue 34): grpo_learn_cpu.sh (the toy model and task, groups of 32, an
# entropy bonus of 0.02, lr 3e-3, every CPU feature on) for 16 steps instead of 20 with DAPO as verl 0.9.1's V1 trainer
# implements it: clip-higher 0.2 / 0.28, token-mean loss, dynamic sampling (groups whose responses
# all score the same are dropped and refilled, 2 generation batches in flight), the dapo reward
# manager, and DAPO's overlong reward shaping with the same keys as the NPU DAPO recipes (recipes/qwen3-32b/dapo_32die.sh).
#   bash ray_start_npu.sh recipes/qwen3-tiny/dapo_learn_cpu.sh recipes/qwen3-tiny/env_cpu_learn.sh
# Env: env_cpu_learn.sh
# Responses may be 3 tokens here and the last one is the overlong buffer: "digit <|im_end|>" keeps its
# reward, a response cut at 3 tokens loses penalty_factor, so the policy learns both the answer and
# to stop after it (the random model's responses are 2.9 tokens on average, the trained one's 2.0).
# - penalty_factor 0.05, the size of the task's credit for a wrong digit, not DAPO's 1.0: with 1.0
#   (and with 0.2) the policy first learned to stop at once (an empty answer loses nothing) and only
#   then to read the prompt; validation 0.51 at step 20 with 1.0, 0.81 with 0.05 (groups of 16).
# - filter_groups.metric=acc (DAPO's own, and the NPU DAPO recipes'): a group whose 32 answers are
#   all right is dropped once the policy knows a prompt. With the shaped reward a group had to agree
#   on its length as well, and one CI run (e92c70f) ended with lengths still mixed (2.2 tokens) and no
#   group dropped in 16 steps, so the run never showed dynamic sampling at work.
# Measured (docs/e2e.md, "Learning runs"): with groups of 32, validation 0 / 0.37 / 0.93 / 1.0 / 1.0
# at steps 0/4/8/12/16 in 6 min 13 s (with groups of 16 and 20 steps: 0.75-0.93 at the end); with
# metric acc on a slower machine 0 / 0.32 / 0.81 / 1.0 / 1.0, groups dropped from step 9, 15 min 6 s.
# Evidence: python -m npu_rl.e2e check RUN_DIR --min-steps 16 --learned 0.1 --final-val 0.9 --dapo
set -euo pipefail
DAPO=(
    algorithm.filter_groups.enable=True
    algorithm.filter_groups.metric=acc
    algorithm.filter_groups.max_inflight_gen_batches=2
    reward.reward_manager.name=dapo
    actor_rollout_ref.actor.clip_ratio_low=0.2
    actor_rollout_ref.actor.clip_ratio_high=0.28
    actor_rollout_ref.actor.loss_agg_mode=token-mean
    # four optimizer steps per training step, with the old-log-prob pass: the PPO ratio and DAPO's
    # clip-higher act only off-policy (grpo_learn_cpu.sh is on-policy, one step per batch)
    actor_rollout_ref.actor.ppo_mini_batch_size=8
    actor_rollout_ref.actor.recompute_old_log_prob=true
    data.max_response_length=3
    actor_rollout_ref.rollout.max_model_len=23
    +reward.reward_kwargs.overlong_buffer_cfg.enable=True
    +reward.reward_kwargs.overlong_buffer_cfg.len=1
    +reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.05
    +reward.reward_kwargs.overlong_buffer_cfg.log=True
    +reward.reward_kwargs.max_resp_len=3
    trainer.experiment_name=qwen3-toy-dapo
    # 16 steps: each of its three runs passed 0.9 by step 8 or 12, and its late steps are the slow ones
    # (dynamic sampling refills as more groups score alike)
    trainer.total_training_steps=16
    trainer.test_freq=4
)
exec bash "$(dirname "${BASH_SOURCE[0]}")/grpo_learn_cpu.sh" "${DAPO[@]}" "$@"
