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

REBALANCE_MIN_GAIN = 0.1
"""A survivor moves to refill a stage group a departure shrank only if the planned iteration gets this much shorter."""

REBALANCE_HORIZON = 10
"""Iterations a rebalancing move must pay its state transfer back in (a volunteer may join and refill it sooner)."""

REBALANCE_CANDIDATES = 6
"""Survivors a re-plan tries as the mover into each shrunk stage group (each try plans the paths quickly)."""

STATE_BYTES_PER_PARAM_BYTE = 3
"""A stage's state on the wire per byte of its weights: the weights and AdamW's two moments."""

MAX_PEERS = 4096
MAX_STAGES = 256
MAX_MICROBATCHES = 1_000_000
"""Upper bounds accepted from files and the network, checked before building anything."""
