"""Values that both the planner and the runtime use. Import them; never retype them."""

SCHEDULE_FORMAT_VERSION = 1
"""Bumped whenever the schedule's fields change meaning; readers refuse other versions."""

DEFAULT_MEMORY_SLOTS = 3
"""Microbatch activations a peer may hold awaiting their backward pass (the reference's m)."""

DEFAULT_MAX_SWAPS = 2
"""Hops below the frontier allowed on one path (the reference's bounded reordering)."""

DEFAULT_MAX_SWAP_DISTANCE = 1
"""How far below the frontier a swapped hop may go."""

DEFAULT_MAX_JUMP = 4
"""How many stages above the frontier one hop may jump."""

DEFAULT_MESSAGE_OVERHEAD_SECONDS = 0.35
"""Per-message fixed cost (serialisation, host-device copies) until a peer measures its own."""

BACKWARD_FACTOR = 1.5
"""Backward time of a stage relative to its forward time."""

LOSS_FACTOR = 0.25
"""Time of the loss step at the data holder relative to its forward time."""

MAX_JITTER_SAMPLES = 1024
"""Message-time deviations a cost table keeps (pooled over the swarm's peers)."""

MAX_JITTER_SECONDS = 60.0
"""Largest deviation of one message's time accepted as jitter (beyond it, a link is broken, not jittery)."""

JITTER_QUANTILES = 16
"""Points of its measured jitter distribution a peer publishes."""

MAX_PEERS = 4096
MAX_STAGES = 256
MAX_MICROBATCHES = 1_000_000
"""Upper bounds accepted from files and the network, checked before building anything."""
