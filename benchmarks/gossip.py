"""Gossip control plane latency: publish -> deliver across three sidecars on loopback (A - B - C, two hops).

Usage: python benchmarks/gossip.py [--messages N] [--sizes 256,65536]

Prints the median and p90 latency from A's publish call to the owner callbacks of B (one hop) and C (two hops),
each next to a baseline measured in the same run: the one-way latency of the same frame over a raw loopback TCP
socket between two threads (half a round trip). Also prints how long a sidecar takes to start and to close.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from swarm.control.gossip import GossipClient, GossipMessage, encode_payload, schedule_topic  # noqa: E402
from swarm.net.identity import ensure_identity  # noqa: E402

TOPIC = schedule_topic("bench")
PACE = 0.02
"""Seconds between publishes: stays under GossipSub's per-topic rate limit and lets each message settle."""


def tcp_one_way_seconds(frame: bytes, rounds: int) -> list[float]:
    """Half the round trip of ``frame`` echoed over loopback TCP between two threads."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def echo() -> None:
        conn, _ = server.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while data := _recv_exactly(conn, len(frame)):
                conn.sendall(data)

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    out = []
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(rounds):
            start = time.perf_counter()
            client.sendall(frame)
            _recv_exactly(client, len(frame))
            out.append((time.perf_counter() - start) / 2)
    thread.join(5)
    server.close()
    return out


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return b""
        buf += chunk
    return bytes(buf)


class Arrivals:
    """Records when each message number reaches an owner's callback."""

    def __init__(self) -> None:
        self.times: dict[int, float] = {}
        self.cond = threading.Condition()

    def __call__(self, message: GossipMessage) -> None:
        with self.cond:
            self.times[message.payload["i"]] = time.perf_counter()
            self.cond.notify_all()

    def wait(self, i: int, timeout: float) -> float | None:
        with self.cond:
            self.cond.wait_for(lambda: i in self.times, timeout)
            return self.times.get(i)


def ms(values: list[float]) -> str:
    values = sorted(values)
    p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
    return f"median {statistics.median(values) * 1e3:8.3f} ms  p90 {p90 * 1e3:8.3f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50)
    parser.add_argument("--sizes", default="256,65536", help="payload bytes, comma-separated")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="gossip-bench-") as tmp:
        keys = [os.path.join(tmp, f"{name}.key") for name in "ABC"]
        for key in keys:
            ensure_identity(key)
        arrivals = {"B": Arrivals(), "C": Arrivals()}
        clients = [GossipClient(), GossipClient(on_message=arrivals["B"]), GossipClient(on_message=arrivals["C"])]
        try:
            start = time.perf_counter()
            with ThreadPoolExecutor(3) as pool:
                infos = list(pool.map(lambda ck: ck[0].start(ck[1], log_path=os.path.join(tmp, "sidecars.log")),
                                      zip(clients, keys, strict=True)))
            print(f"3 sidecars started in parallel in {time.perf_counter() - start:.2f} s")
            a, b, c = clients
            for client in clients:
                client.subscribe(TOPIC)
            b.connect(infos[0].maddrs[0])
            c.connect(infos[1].maddrs[0])
            for client, degree in zip(clients, (1, 2, 1), strict=True):
                client.wait_for_mesh(TOPIC, degree, timeout=10)
            pipe = []
            for _ in range(args.messages):
                t = time.perf_counter()
                a.status()
                pipe.append(time.perf_counter() - t)
            print(f"owner <-> sidecar pipe round trip (status): {ms(pipe)}")
            i = 0
            for size in sizes:
                hop1, hop2, lost = [], [], 0
                for _ in range(args.messages):
                    i += 1
                    payload = {"i": i, "blob": bytes(size)}
                    t = time.perf_counter()
                    a.publish(TOPIC, payload, wait=False)
                    t_b, t_c = arrivals["B"].wait(i, 5.0), arrivals["C"].wait(i, 5.0)
                    if t_b is None or t_c is None:
                        lost += 1
                        continue
                    hop1.append(t_b - t)
                    hop2.append(t_c - t)
                    time.sleep(PACE)
                if not hop1:
                    print(f"{size} B payload: all {lost} messages lost")
                    continue
                frame = encode_payload({"i": i, "blob": bytes(size)})
                tcp = tcp_one_way_seconds(frame, args.messages + 10)[10:]  # the first rounds warm up
                base = statistics.median(tcp)
                print(f"{size:>7} B payload, {len(hop1)} messages ({lost} lost)")
                print(f"  raw loopback TCP one way   {ms(tcp)}")
                print(f"  gossip 1 hop (A -> B)      {ms(hop1)}  = {statistics.median(hop1) / base:6.0f} x TCP")
                print(f"  gossip 2 hops (A -> B -> C) {ms(hop2)}  = {statistics.median(hop2) / base:6.0f} x TCP")
        finally:
            start = time.perf_counter()
            for client in clients:
                client.close()
            print(f"3 sidecars closed in {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
