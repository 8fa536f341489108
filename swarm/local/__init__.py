"""A whole swarm on one machine, for the demo, tests and benchmarks.

- local_swarm.py: LocalSwarm, a coordinator and N peers as processes on loopback (or on an EmulatedNetwork)
- emulated_network.py: EmulatedNetwork, hosts in network namespaces with kernel-shaped links, latency files
- nat_network.py: NatNetwork, public hosts and home networks behind NAT routers (iptables), for the NAT tests
- namespaces.py: what both networks share: commands, bridge, tear-down, latency files for the transport
- interrupts.py: deferred_interrupts, clean-up that a second Ctrl+C cannot cut short
- throttle.py: Throttle, a process run part of the time (a volunteer's machine taken by another job)
"""
