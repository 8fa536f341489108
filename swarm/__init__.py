"""Everything that crosses a network, and the command line.

The code is organized as follows:
- cli.py: the `skippipe` and `skippipe-peer` click groups; each subcommand in its own cli_*.py
- cli_plan.py: `skippipe plan` and `skippipe simulate`
- cli_demo.py: `skippipe demo`, the README's main job
- cli_train.py: `skippipe swarm inprocess` and `skippipe eval`
- constants.py: network limits (header/tensor sizes, dtypes, timeouts, heartbeat, expiry); ports default to 0
- wire.py: WireError and the msgpack wire records (TensorDescriptor, HopHeader, PeerRecord, RunSpec, ScheduleMsg)
- identity.py: one RSA key file per peer (same peer id in p2pd and the gossip sidecar), sign / verify
- records.py: SwarmRecords, the signed DHT records (run spec, per-peer heartbeat records, current schedule)
- transport.py: Transport, activations and gradients over hivemind p2pd binary streams, with backpressure
- link_probe.py: LinkProber, latency and goodput to sampled peers (EWMA), the links map of a PeerRecord
- averaging.py: StageAverager, per-stage DecentralizedAverager rounds weighted by microbatches processed
- gossip.py: GossipClient, the owner side of the GossipSub control plane (schedules, membership), over a pipe
- gossip_sidecar.py: the py-libp2p GossipSub sidecar process that GossipClient starts (never imports hivemind)
"""
