# shellcheck shell=bash
# Two A3 nodes of 16 dies; the dry run plans this machine as the head.
export NNODES=2
export NPUS_PER_NODE=16
