"""Speculation: drafters (`drafters/`, one file each), planners (`planners/`: fixed and
adaptive), the cost model and its calibration, sampling (warping p and q alike), and the
speculative config. Knows token ids and tensors; nothing about text."""
