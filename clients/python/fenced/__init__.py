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

:mod:`fenced.aio` is the same client for asyncio. The package logs through
:mod:`logging` under the logger ``"fenced"`` (``fenced.keeper``,
``fenced.update``, ``fenced.watch``, ``fenced.fork``) and never prints.

Imported before grpc, the package sets ``GRPC_ENABLE_FORK_SUPPORT=true`` in
``os.environ`` unless it is set already (grpcio reads it when first imported):
with it, and the fork handling of :mod:`fenced._fork`, a process using the
client may ``fork()`` (multiprocessing's "fork" start method included), and
each child makes its own Client.
"""

import logging as _logging
import os as _os
import sys as _sys

if "grpc" not in _sys.modules:
    # grpcio's fork support must be chosen before grpc is first imported; a
    # value the caller set (even "false") is kept. See fenced/_fork.py.
    _os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "true")

_logging.getLogger("fenced").addHandler(_logging.NullHandler())

from . import _fork  # noqa: E402,F401  (registers the fork hooks)
from .client import CHANNEL_OPTIONS, MAX_MESSAGE_BYTES, QUEUED_RETRIES, Client  # noqa: E402
from .errors import (  # noqa: E402
    REASONS,
    CallsQueued,
    Cancelled,
    Conflict,
    DeadlineExceeded,
    FencedError,
    FieldViolation,
    InvalidArgument,
    KeptChanging,
    LayoutDocument,
    FenceRequired,
    BatchInFlight,
    UpdateCancelled,
    UpdateInterrupted,
    LeaseHeld,
    Reason,
    RedisRefusal,
    RequestIdReused,
    ReplicationTimeout,
    ResourceExhausted,
    RevisionCompacted,
    RevisionConflict,
    RevisionLimit,
    SnapshotTooLarge,
    RevisionWentBackwards,
    StaleLease,
    Unavailable,
    decode,
    declared_reasons,
)
from .keeper import ClaimKeeper, LeaseKeeper  # noqa: E402
from .model import (  # noqa: E402
    BLIND,
    UNFENCED,
    BatchResult,
    Change,
    Check,
    CheckCount,
    CheckRecords,
    CheckSection,
    ClaimEvent,
    ClaimFence,
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
    count_check,
    dumps,
    new_request_id,
)
from .revisions import compare_revisions  # noqa: E402
from .update import MAX_LOST_REPLY_RETRIES, MAX_UPDATE_ATTEMPTS, SectionView, Txn  # noqa: E402
from .view import View, ViewBehind, ViewUnsupported  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "BLIND",
    "UNFENCED",
    "BatchResult",
    "CHANNEL_OPTIONS",
    "CallsQueued",
    "Cancelled",
    "Change",
    "Check",
    "CheckCount",
    "CheckRecords",
    "CheckSection",
    "ClaimEvent",
    "ClaimKeeper",
    "ClaimFence",
    "Client",
    "Conflict",
    "Current",
    "DeadlineExceeded",
    "Delete",
    "Event",
    "FencedError",
    "FieldViolation",
    "InvalidArgument",
    "KeptChanging",
    "Layout",
    "LayoutDocument",
    "FenceRequired",
    "BatchInFlight",
    "UpdateCancelled",
    "UpdateInterrupted",
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
    "QUEUED_RETRIES",
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
    "SnapshotTooLarge",
    "RevisionWentBackwards",
    "SectionView",
    "Snapshot",
    "StaleLease",
    "Txn",
    "Unavailable",
    "View",
    "ViewBehind",
    "ViewUnsupported",
    "Write",
    "compare_revisions",
    "count_check",
    "decode",
    "declared_reasons",
    "dumps",
    "new_request_id",
]
