"""A whole swarm on one machine, for the demo, tests and benchmarks.

- local_swarm.py: LocalSwarm, a coordinator and N peers as processes on loopback (or on an EmulatedNetwork)
- emulated_network.py: EmulatedNetwork, hosts in network namespaces with kernel-shaped links, latency files
- interrupts.py: deferred_interrupts, clean-up that a second Ctrl+C cannot cut short
"""
