"""The edges: everything that talks to another system (ClickHouse, the state store, Kafka, the DLQ,
Prometheus). They reach the core, the formats and the config, never the delivery or Spark wiring."""
