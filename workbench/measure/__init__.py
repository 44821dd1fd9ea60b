"""Measurement: the one timing module, FLOPs, measured and datasheet peaks, the profiler check."""
