"""Everything that crosses a network, and the command line.

The code is organized as follows:
- cli.py: the `skippipe` and `skippipe-peer` click groups; each subcommand in its own cli_*.py
- cli_plan.py: `skippipe plan` and `skippipe simulate`
- cli_demo.py: `skippipe demo`, the README's main job
- cli_train.py: `skippipe swarm inprocess` and `skippipe eval`
- cli_run.py: `skippipe coordinator start`, `skippipe-peer join` and `skippipe swarm local`
- run_config.py: RunConfig, a run as TOML data, and the signed run spec it becomes
- coordinator.py: Coordinator, plans from the live swarm, commits iterations, re-plans on churn (also the role a
  peer takes over when the coordinator dies)
- shard_assignment.py: which data holder draws from which of the run's shards, epoch after epoch
- unreachable_reports.py: UnreachableReports, peers' "cannot reach X" reports, corroborated into an early verdict
- peer.py: Peer, one volunteer's process: join, announce, get placed, iterate, leave
- pipeline.py: PipelineExecutor, one peer's part of one iteration, driven by the messages it receives
- stage_allgather.py: exact visit-weighted gradient averaging of a stage group over the transport
- state_transfer.py: a stage's weights and optimizer state handed to a joining peer
- local_swarm.py: LocalSwarm, a coordinator and N peers as processes on loopback (or on an EmulatedNetwork)
- emulated_network.py: EmulatedNetwork, hosts in network namespaces with kernel-shaped links, latency files
- timeline.py: Timeline, a peer's compute and send spans, and the Chrome trace of a whole run
- dht_shutdown.py: stop_dht, a DHT shut down without leaving its p2pd socket behind
- interrupts.py: deferred_interrupts, clean-up that a second Ctrl+C cannot cut short
- constants.py: network limits (header/tensor sizes, dtypes, timeouts, heartbeat, expiry); ports default to 0
- wire.py: WireError and the msgpack wire records (TensorDescriptor, HopHeader, PeerRecord, RunSpec, ScheduleMsg)
- identity.py: one RSA key file per peer (same peer id in p2pd and the gossip sidecar), sign / verify
- records.py: SwarmRecords, the signed DHT records (run spec, per-peer heartbeat records, current schedule)
- transport.py: Transport, activations and gradients over hivemind p2pd binary streams, with backpressure
- link_probe.py: LinkProber, latency and goodput to sampled peers (EWMA), the links map of a PeerRecord
- message_jitter.py: MessageJitter, how far received messages' times deviate from their link's median
- averaging.py: StageAverager, per-stage DecentralizedAverager rounds weighted by microbatches processed
- gossip.py: GossipClient, the owner side of the GossipSub control plane (schedules, membership), over a pipe
- gossip_sidecar.py: the py-libp2p GossipSub sidecar process that GossipClient starts (never imports hivemind)
- signed_record_cache.py: the sidecar verifies each peer's signed peer record once, not on every message
"""
