"""The network edge of a node: who it is, how tensors travel, what links cost.

- identity.py: one RSA key file per peer (same peer id in p2pd and the gossip sidecar), sign / verify
- transport.py: Transport, activations and gradients over hivemind p2pd binary streams, with backpressure
- channels.py: the transport's kinds of traffic (hop, average, state), one protocol each, and its probe protocol
- stream_routes.py: StreamRoutes, how a stream reaches a peer: a direct dial raced against its relay, and which
  relays' forwarded streams this peer serves
- forwarding.py: Forwarder, a public peer's forwarding of members' streams to peers behind NAT (the relay)
- reachability.py: whether this node can be dialled, and the p2pd flags for reserving a relay
- transport_errors.py: TransportError and its kinds (PeerUnreachable, MessageRefused)
- receiver.py: Receiver, the transport's receiving side: every inbound message checked before its buffer exists
- receive_limits.py: who may send what (Admitted, Expects, StateGate) and SenderLimits (streams, pending bytes, pace)
- idle_streams.py: IdleStreams, the open streams a sender reuses per receiver
- delivery.py: Inbound and Undelivered (what the transport hands up), Send (how loops hand it messages)
- link_probe.py: LinkProber, latency and goodput to sampled peers (EWMA), the links map of a PeerRecord
- message_jitter.py: MessageJitter, how far received messages' times deviate from their link's median
- p2p_client.py: own_p2p, a client of the node's p2pd for one event loop (hivemind shares one per process)
- dht_pipe.py: make_commands_safe, a DHT process that reads each command whole (large values killed it)
- dht_shutdown.py: stop_dht, a DHT shut down without leaving its p2pd socket behind
- reaper.py: Reaper, a watchdog process that stops a node's helpers (DHT, p2pd, sidecar) when the node dies
"""
