#!/usr/bin/env bash
# A broken recipe: it forgets "$@", so overrides given on the launcher's command line are lost.
exec bash "$(dirname "${BASH_SOURCE[0]}")/base_qwen3_32b.sh"
