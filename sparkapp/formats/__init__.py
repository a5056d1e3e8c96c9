"""Record formats: turning Kafka values into rows of the target table (registry.py names them all).

Formats see the core only; the table's schema arrives already read (edges/clickhouse.py reads it).
"""
