"""The multi-node launcher behind ``ray_start_npu.sh``: topology, node environment, Ray head/worker."""
