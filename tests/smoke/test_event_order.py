"""The tests read a sink's Events in the order the operator posted them (CI: Pausing and Paused in one second
came back as Paused, Pausing)."""

from tests.helpers import events_oldest_first


def event(name: str, reason: str, micro: str, rv: str) -> dict[str, object]:
    # as the API server lists what kopf posted: whole seconds in lastTimestamp, microseconds in eventTime
    return {"metadata": {"name": name, "resourceVersion": rv}, "reason": reason,
            "lastTimestamp": "2026-12-03T14:31:07Z", "eventTime": f"2026-12-03T14:31:07.{micro}Z"}


def test_events_of_one_second_keep_the_order_they_were_posted_in():
    listed = [event("events.a1", "Paused", "912004", "9001"), event("events.f7", "Pausing", "118350", "8990")]
    assert [e["reason"] for e in events_oldest_first(listed)] == ["Pausing", "Paused"]


def test_resource_version_orders_events_without_an_event_time():
    listed = [{"metadata": {"resourceVersion": "12"}, "reason": "b", "lastTimestamp": "2026-12-03T14:31:07Z"},
              {"metadata": {"resourceVersion": "9"}, "reason": "a", "lastTimestamp": "2026-12-03T14:31:07Z"}]
    assert [e["reason"] for e in events_oldest_first(listed)] == ["a", "b"]
