"""Delivery: the exactly-once protocol per partition (writer.py), its at-least-once baseline (plain.py),
and the per-process runtime that wires edges to it (runtime.py). Spark-free: the same code runs on the
driver and on executors."""
