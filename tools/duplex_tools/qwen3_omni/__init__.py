"""Baselines of the qwen3_omni family: the same models run fused in one loop (what the staged
pipeline is benchmarked against) and the whole-model reference the streaming stages must match."""
