"""Kafka is real: produce and consume across partitions with committed offsets read back."""

from confluent_kafka import Consumer, Producer, TopicPartition


def test_produce_consume_commit(kafka, topic):
    name = topic(4)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    for i in range(1000):
        producer.produce(name, key=str(i).encode(), value=f'{{"i": {i}}}'.encode(), partition=i % 4)
    assert producer.flush(30) == 0

    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": f"g-{name}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([name])
    seen: dict[int, list[int]] = {p: [] for p in range(4)}
    while sum(map(len, seen.values())) < 1000:
        msg = consumer.poll(10)
        assert msg is not None, "timed out waiting for messages"
        assert msg.error() is None
        seen[msg.partition()].append(msg.offset())
    consumer.commit(asynchronous=False)
    committed = consumer.committed([TopicPartition(name, p) for p in range(4)], timeout=10)
    consumer.close()

    assert {p: len(v) for p, v in seen.items()} == {p: 250 for p in range(4)}
    assert all(v == list(range(250)) for v in seen.values())
    assert sorted((tp.partition, tp.offset) for tp in committed) == [(p, 250) for p in range(4)]
