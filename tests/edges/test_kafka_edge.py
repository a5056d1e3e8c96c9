"""The Kafka edge names an outage as one (KafkaUnavailableError), so the operator reports KafkaUnavailable, not
a raw client error, while a broker restarts."""

from __future__ import annotations

import pytest

from hack.testbed.process import free_port
from sparkapp.config import KafkaConfig
from sparkapp.edges.kafka import KafkaUnavailableError, all_watermarks, watermarks


def test_offsets_of_an_unreachable_broker_are_an_outage_naming_the_partition() -> None:
    cfg = KafkaConfig.model_validate({"bootstrapServers": f"127.0.0.1:{free_port()}", "topics": ["t"],
                                      "options": {"socket.connection.setup.timeout.ms": "1000"}})
    with pytest.raises(KafkaUnavailableError, match=r"t/0.*127\.0\.0\.1"):
        all_watermarks(cfg, {"t": 2}, timeout=2)
    with pytest.raises(KafkaUnavailableError, match=r"t/0"):
        watermarks(cfg, "t", 0, timeout=2)
