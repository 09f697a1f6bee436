"""Run evidence: what a finished run shows. :mod:`npu_rl.evidence.report` writes the report a user
reads (``python -m npu_rl.report RUN_DIR``). The checks that gate CI (:mod:`npu_rl.e2e`,
:mod:`npu_rl.e2e_async`) move here with the feature-package redesign (issue 35).
"""
