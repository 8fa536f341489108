"""Network limits, timeouts and periods of the swarm: one home for each, imported, never retyped.

Planner-and-runtime values (memory slots, message overhead, ...) live in ``scheduler/constants.py`` instead.
Sizes are bytes, times are seconds.
"""

from scheduler.constants import MAX_PEERS, MAX_STAGES

SEND_CONCURRENCY = 4
"""Messages a peer sends at once (its sender threads); the transport keeps as many idle streams per receiver."""
WIRE_VERSION = 6
"""Version of every wire record; decoders refuse records of another version. 5: records carry their author's proof
of the join token, and nodes store members' records only (a node of version 4 would be refused, not split off).
6: a data holder named in a commit's `left_out` puts its draws back (a holder of version 5 would count them as
processed while the commit does not)."""

# ---- sizes checked before anything is allocated ---------------------------------------------------------------
MAX_HEADER_BYTES = 64 * 1024
"""Largest msgpack header in front of a tensor on a stream."""
MAX_LINEAGE_BYTES = 32
"""A stage copy's lineage in an averaging header (`swarm.stage_group.lineage`)."""
CHUNK_BYTES = 64 << 20
"""Default piece size of a stage-group message too large for one (`swarm.chunk_bytes`): a few seconds to half a
minute on a 2-20 MB/s volunteer link, well within one message's deadline."""
MIN_CHUNK_BYTES = 64 << 10
MAX_CHUNKS = 1 << 16
"""Pieces of one chunked stage-group message (`swarm.peer.message_chunks`: 4 TiB in 64 MiB pieces)."""
MAX_TENSOR_BYTES = 1 << 30
"""Largest tensor a peer accepts on a stream (1 GiB: a 1.5B-class activation at ctx 4096 is ~270 MB)."""
MAX_TENSOR_NDIM = 8
MAX_RECORD_BYTES = 512 * 1024
"""Largest DHT record (an envelope holding a peer record, run spec or schedule) a reader unpacks."""
MAX_SCHEDULE_BYTES = 16 * 1024 * 1024
"""Largest signed schedule: routes of every microbatch of an iteration."""
MAX_GOSSIPED_SCHEDULE_BYTES = 256 * 1024
"""Largest schedule (with its bridge) a notice carries on gossip (a 20-peer epoch is ~30 KB): a larger one is read
from the DHT. Half of a gossip payload's limit, with room for the notice around it."""
MAX_ID_CHARS = 128
"""Longest peer id or run id (a base58 RSA peer id is 46 characters)."""
MAX_ADDRESSES = 32
"""Multiaddrs a peer may announce."""
MAX_ADDRESS_CHARS = 512
MAX_LINKS = 256
"""Measured links in one peer record (a sample of the swarm, not all of it)."""
MAX_ROUTE_HOPS = MAX_STAGES + 1
"""A route lists the origin and at most one peer per stage."""
MAX_MICROBATCH_ATTEMPTS = 3
"""Times a data holder re-queues one microbatch within an iteration (a peer on its path died each time) before it
gives up and the iteration is run again."""
MAX_SHARDS = 1024
"""Data shards of one run (as many as its first plan had data holders): bounds the positions a report carries."""
MAX_PLAIN_DEPTH = 8
"""Nesting depth of the free-form dicts of a run spec (model config, hyperparameters, data settings)."""
MAX_PLAIN_ITEMS = 4096
"""Keys and list items, all levels together, of one free-form dict of a run spec."""
MAX_STRING_CHARS = 4096
"""Longest string inside a free-form dict."""
MAX_PROOF_BYTES = 64
"""A join token's proof (an HMAC-SHA256, hex)."""
MAX_CERT_BYTES = 2048
"""A membership certificate: ids, expiry, the issuer's public key and signature."""
CERT_LIFETIME = 1800.0
"""How long a membership certificate is valid; the scheduler renews those of the peers that still beat when a
third of it is left."""
MAX_ERROR_CHARS = 512
"""Longest error text a receiver sends back to a sender."""
MAX_PROBE_BYTES = 64 * 1024 * 1024
"""Largest goodput probe a peer answers."""
assert MAX_PEERS >= MAX_LINKS

WIRE_DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")
"""Tensor dtypes accepted on the wire, by torch name."""
COMPRESSION_DTYPES = ("float16", "bfloat16")
"""Dtypes a floating tensor may be cast to for the wire (halves the bytes of float32)."""
RESTORE_DTYPES = ("float32", "float16", "bfloat16")
"""Dtypes a receiver casts a compressed tensor back to (`HopHeader.restore_dtype`): at most twice its wire bytes,
never float64 or from an integer, so a header cannot make a receiver inflate a tensor beyond what compression saved."""

FAULTS = ("scale-gradients", "huge-gradients", "inflate-weight", "byzantine", "corrupt-activations",
          "withhold-activations", "withhold-state", "crash-mid-average")
"""Misbehaviours a peer can be told to show on purpose (`swarm.peer.faults`), to test a swarm's defences."""

# ---- addresses --------------------------------------------------------------------------------------------------
DEFAULT_PORT = 0
"""0 = let the OS pick a free port; never hard-code one."""
DEFAULT_HOST = "0.0.0.0"
LOOPBACK_HOST = "127.0.0.1"

# ---- timeouts, periods, expiry ----------------------------------------------------------------------------------
P2PD_STARTUP_TIMEOUT = 60.0
"""Seconds a node's p2p daemon may take to start (hivemind's default, 15, is missed on a loaded host)."""
DHT_START_ATTEMPTS = 3
"""Tries to start a node's DHT: a p2p daemon that does not start, or reaches none of its bootstrap peers (busy,
or not up yet), is started again after `DHT_START_BACKOFF` x its try's number seconds. (Before its own daemon,
hivemind starts a throwaway one that checks the key is not online elsewhere; that one keeps hivemind's 15 s.)"""
DHT_START_BACKOFF = 5.0
DHT_READY_TIMEOUT = P2PD_STARTUP_TIMEOUT + 30.0
"""Seconds a node's DHT process may take to be ready: its daemon's start and a first ping of a bootstrap peer (5-16 s
for 20 peers on 2 cores). One that is not is killed and started again (`DHT_START_ATTEMPTS`): one joiner in 70 of
a 20-peer churn benchmark hung there, silently, until the run ended."""
DHT_TIMEOUT = 10.0
"""One DHT store or get."""
CONNECT_TIMEOUT = 10.0
"""Opening a stream to a peer."""
SEND_TIMEOUT = 120.0
"""Sending one tensor and getting its acknowledgement (includes waiting while the receiver's queue is full)."""
RECV_TIMEOUT = 60.0
"""Between two reads on an inbound stream: a sender that stalls longer is dropped."""
PROBE_TIMEOUT = 30.0
"""One goodput probe (on a 0.25 MB/s link a 4 MiB probe takes 17 s)."""
PROBE_PING_TIMEOUT = 10.0
"""One latency probe (a few bytes): a live peer answers well within it even on a loaded host; a frozen one never
does, and with PROBE_TIMEOUT a joiner's first round waited 30 s on each frozen peer of its sample."""
AVERAGING_TIMEOUT = 60.0
"""One stage-group averaging round (matchmaking and all-reduce), unless the caller passes a deadline."""
HEARTBEAT_PERIOD = 5.0
"""How often a peer refreshes its DHT record."""
RECORD_HEARTBEATS = 3
"""A heartbeat record lives this many heartbeat periods: a peer that misses 3 beats drops out of the view."""
RECORD_GRACE = 2.0
"""Beyond its lifetime, how long an unseen record still counts (a DHT read that missed it)."""


def record_lifetime(heartbeat: float) -> float:
    """Seconds a heartbeat record lives after its last beat, for a run beating every `heartbeat` seconds."""
    return RECORD_HEARTBEATS * heartbeat


def silent_after(heartbeat: float) -> float:
    """Seconds without a peer's record after which it is taken for gone: its lifetime and a grace."""
    return record_lifetime(heartbeat) + RECORD_GRACE


PEER_RECORD_TTL = record_lifetime(HEARTBEAT_PERIOD)
"""A peer record's lifetime at the default heartbeat."""
RUN_SPEC_TTL = 3600.0
"""Lifetime of the run spec; the coordinator refreshes it well before."""
SCHEDULE_TTL = 3600.0
"""Lifetime of the stored current schedule (late joiners read it)."""
MAX_RECORD_LIFETIME = 7 * 24 * 3600.0
"""Records claiming to live longer than this are refused (a bounded expiry limits replay of old records)."""
MAX_HEARTBEAT = 60.0
"""Slowest heartbeat a run may choose."""
MAX_PEER_RECORD_LIFETIME = record_lifetime(MAX_HEARTBEAT)
"""Peer records claiming to live longer than this are refused: a dead peer's record must not outlive it for long."""

# ---- transport and probing --------------------------------------------------------------------------------------
INBOUND_QUEUE_SIZE = 4
"""Received tensors waiting for the consumer; when full, senders wait (backpressure)."""
INBOX_SIZE = 16
"""Accepted messages waiting for a peer's main loop to sort them; when full, the transport's consumer waits, then
its queue fills and senders wait (backpressure from a slow stage to the stages sending to it)."""
MAX_BUFFERED_MESSAGES = 1024
"""Sorted messages a peer keeps for iterations, epochs or uses it has not reached yet; past this it stops taking
messages from its inbox until it catches up (far above what one iteration brings)."""
OUTBOX_SIZE = 64
"""Messages a peer has handed to its sender threads and not yet sent; a peer that would exceed it waits."""
AVERAGE_OUTBOX_SIZE = 1024
"""The same for stage-averaging messages: a round by parts hands over up to n (n - 1) + 5 (n - 1) at once (pieces,
means, ballot, every part's fallback piece), views of one gradient that cost no copies while they wait. Members
blocked handing theirs over would not read each other's, so the room covers a round of 30 members."""
MIN_TRANSFER_RATE = 64 * 1024
"""Bytes per second an inbound tensor must arrive at on average, after a grace of the receive timeout: a message
of n bytes is dropped once it has taken longer than recv_timeout + n / MIN_TRANSFER_RATE (its total deadline), and
earlier if it falls behind that pace, so a header claiming a huge tensor cannot hold a receive slot by trickling
(512 kbit/s: a volunteer's slow uplink, shared by a few messages, still passes)."""
MAX_PENDING_BYTES_PER_SENDER = 2 * MAX_TENSOR_BYTES
"""Tensor bytes one sender may have allocated on a receiver, per channel, and not yet consumed (read, queued, cast
back): past it that sender's next message waits, before its buffer is allocated. A message larger than this on
its own is admitted when the sender has nothing pending."""
MAX_INBOUND_STREAMS_PER_SENDER = 32
"""Streams one peer may hold open to a receiver at once, all protocols together (an honest one keeps
SEND_CONCURRENCY idle per protocol); further ones are closed at once."""
STATE_EXPECT_SECONDS = 120.0
"""How long a peer named as the source of a stage state transfer may send it (the joiner's wait for its state)."""
STATE_ADMISSION_WAIT = 30.0
"""How long a STATE message from a peer not (yet) named as a source waits, before its buffer is allocated, for the
receiver to name it (its sender may adopt the schedule that names it a moment before the receiver does)."""
STREAM_CHUNK_BYTES = 1 << 20
PROBE_PING_BYTES = 1024
PROBE_GOODPUT_BYTES = 4 * 1024 * 1024
PROBE_FIRST_BYTES = 256 * 1024
"""A goodput probe starts this small; the full PROBE_GOODPUT_BYTES follow only on a link fast enough to carry them
within PROBE_GOODPUT_SECONDS (on a 0.25 MB/s link 4 MiB take 17 s, and a probe round that slow left links
unmeasured when the first plan was made)."""
PROBE_GOODPUT_SECONDS = 2.0
PROBE_SAMPLE_SIZE = 8
"""Peers probed per round: a sample, so probing cost does not grow with the swarm."""
PROBE_EWMA_ALPHA = 0.3
"""Weight of a new measurement in the smoothed link estimate."""
