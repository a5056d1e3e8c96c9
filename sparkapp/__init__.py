"""chsink writer: exactly-once Kafka to ClickHouse in a Spark job."""
