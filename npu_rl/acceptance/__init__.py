"""The NPU acceptance suite (``bash tools/npu_acceptance.sh``): one command on one Ascend node that
runs real recipes through ``ray_start_npu.sh``, each feature on and off (A/B), and writes a report
(Markdown, JSON, PNG) a user can attach to a bug or a pull request. docs/npu_acceptance.md.

- :mod:`npu_rl.acceptance.plan`: which runs (recipe, env script, overrides, feature variables) and
  which pairs of them are compared;
- :mod:`npu_rl.acceptance.runner`: runs them one by one through the launcher and leaves no process
  behind;
- :mod:`npu_rl.acceptance.logs`: the numbers of one run, read from its run directory;
- :mod:`npu_rl.acceptance.facts`: the node's software and hardware facts;
- :mod:`npu_rl.acceptance.report`: the report, its tolerances (``baselines.toml``) and redaction.
"""
