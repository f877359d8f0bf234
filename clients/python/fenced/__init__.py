"""fenced: the Python client of fenced, for tick and hive processes.

It mirrors the Go client (github.com/agentihooks/fenced/client): a channel with
production defaults, typed exceptions decoded from gRPC status details (never
from message text), :meth:`Client.update` turning "read, change, write" into
one fenced, rerun batch, and :class:`LeaseKeeper` holding a swarm's lease::

    import fenced

    with fenced.Client("fenced:7420") as c, c.keep("my-swarm", "tick-host1", ttl_ms=10_000) as k:
        def change(tx: fenced.Txn) -> None:
            claims = tx.section("claims")
            claims["T-1"] = fenced.dumps({"by": "tick-host1"})
        revision = c.update("my-swarm", change, fence=k.fence())

Values go in and out as ``str``: JSON text, byte for byte.
"""

from .client import CHANNEL_OPTIONS, MAX_MESSAGE_BYTES, Client
from .errors import (
    REASONS,
    Conflict,
    FencedError,
    FieldViolation,
    InvalidArgument,
    KeptChanging,
    LayoutDocument,
    LeaseHeld,
    Reason,
    RedisRefusal,
    RequestIdReused,
    ReplicationTimeout,
    ResourceExhausted,
    RevisionCompacted,
    RevisionConflict,
    RevisionLimit,
    RevisionWentBackwards,
    StaleLease,
    Unavailable,
    decode,
    declared_reasons,
)
from .keeper import LeaseKeeper
from .model import (
    BLIND,
    BatchResult,
    Change,
    Check,
    CheckRecords,
    CheckSection,
    Current,
    Delete,
    Event,
    Layout,
    Lease,
    LeaseFence,
    MigratedSection,
    MigrateResult,
    Page,
    Put,
    Record,
    ReplicaAck,
    Snapshot,
    Write,
    dumps,
    new_request_id,
)
from .revisions import compare_revisions
from .update import MAX_LOST_REPLY_RETRIES, MAX_UPDATE_ATTEMPTS, SectionView, Txn

__version__ = "0.1.0"

__all__ = [
    "BLIND",
    "BatchResult",
    "CHANNEL_OPTIONS",
    "Change",
    "Check",
    "CheckRecords",
    "CheckSection",
    "Client",
    "Conflict",
    "Current",
    "Delete",
    "Event",
    "FencedError",
    "FieldViolation",
    "InvalidArgument",
    "KeptChanging",
    "Layout",
    "LayoutDocument",
    "Lease",
    "LeaseFence",
    "LeaseHeld",
    "LeaseKeeper",
    "MAX_LOST_REPLY_RETRIES",
    "MAX_MESSAGE_BYTES",
    "MAX_UPDATE_ATTEMPTS",
    "MigratedSection",
    "MigrateResult",
    "Page",
    "Put",
    "REASONS",
    "Reason",
    "Record",
    "RedisRefusal",
    "ReplicaAck",
    "ReplicationTimeout",
    "RequestIdReused",
    "ResourceExhausted",
    "RevisionCompacted",
    "RevisionConflict",
    "RevisionLimit",
    "RevisionWentBackwards",
    "SectionView",
    "Snapshot",
    "StaleLease",
    "Txn",
    "Unavailable",
    "Write",
    "compare_revisions",
    "decode",
    "declared_reasons",
    "dumps",
    "new_request_id",
]
