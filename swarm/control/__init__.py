"""The control plane: signed records in the DHT and gossip between peers and the scheduler.

- records.py: SwarmRecords, the signed DHT records (run spec, per-peer heartbeat records, current schedule)
- gossip.py: GossipClient, the owner side of the GossipSub control plane (schedules, membership), over a pipe
- gossip_sidecar.py: the py-libp2p GossipSub sidecar process that GossipClient starts (never imports hivemind)
- signed_record_cache.py: the sidecar verifies each peer's signed peer record once, not on every message
- messages.py: the typed control messages (join, leave, gone, finished, stuck, broken, unrecoverable, unreachable,
  schedule notice, done, commit), validated on decode
- node.py: Node, the DHT, records, gossip and heartbeat a coordinator and a peer share, with a Reaper
"""
