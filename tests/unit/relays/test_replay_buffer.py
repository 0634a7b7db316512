"""The agent stream's replay buffer: bounded in events and in bytes, oldest dropped first."""

from __future__ import annotations

from gateway.relays.agent_stream import RelayOptions, ReplayBuffer


def test_replay_buffer_drops_the_oldest_past_either_bound():
    buffer = ReplayBuffer(RelayOptions(reconnect_grace=1, replay_events=3, replay_bytes=10))
    for text in ("a", "b", "c", "d"):
        buffer.append(text)
    assert list(buffer.texts) == ["b", "c", "d"] and buffer.dropped == 1
    buffer.append("12345678")  # 4 events: "b" goes, leaving 10 bytes
    assert list(buffer.texts) == ["c", "d", "12345678"] and buffer.dropped == 2
    buffer.append("xy")  # "c" goes for the count, then "d" for the bytes
    assert list(buffer.texts) == ["12345678", "xy"] and (buffer.size, buffer.dropped) == (10, 4)
    assert buffer.drain() == ["12345678", "xy"] and (buffer.size, buffer.dropped) == (0, 6)
