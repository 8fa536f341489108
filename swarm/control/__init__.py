"""The control plane: signed records in the DHT and gossip between peers and the scheduler.

- records.py: SwarmRecords, the signed DHT records (run spec, per-peer heartbeat records, current schedule)
- record_validator.py: open_record, OpenedRecords (its memo) and RunRecordValidator, what makes a record valid,
  for readers and DHT storage
- membership.py: join-token proofs, AdmissionPolicy and MembershipCert, who belongs to a run
- gossip.py: GossipClient, the owner side of the GossipSub control plane (schedules, membership), over a pipe
- gossip_sidecar.py: the py-libp2p GossipSub sidecar process that GossipClient starts (never imports hivemind)
- signed_record_cache.py: the sidecar verifies each peer's signed peer record once, not on every message, and
  serializes its own once
- message_signatures.py: the sidecar verifies each message's signature once, and imports each sender's key once
- messages.py: the typed control messages (join, leave, gone, finished, stuck, broken, unrecoverable, unreachable,
  schedule notice, done, commit, admitted, refused), validated on decode
- node.py: Node, the DHT, records, gossip and heartbeat a coordinator and a peer share, with a Reaper
"""
