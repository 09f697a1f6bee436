#!/usr/bin/env bash
# A broken recipe: it never calls run_verl, so plan mode would check nothing.
set -euo pipefail
echo "pretending to train"
