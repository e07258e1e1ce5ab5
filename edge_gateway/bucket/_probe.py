"""Checking that a store really enforces create-only puts.

Fencing (``docs/bucket.md``, DESIGN "Fencing") rests on one property: of two
creates of the same key, the second fails. Some S3-compatible stores accept
``If-None-Match: *`` and ignore it (s3rver does), which would let a zombie
writer overwrite a log entry silently. The gateway therefore probes the store
once at start and refuses to run if the property does not hold.
"""

from __future__ import annotations

import logging
import uuid
from typing import Final

import trio

from edge_gateway.bucket._base import Bucket
from edge_gateway.bucket._errors import PreconditionFailed, UnsupportedStore
from edge_gateway.errors import EdgeGatewayError

_log = logging.getLogger(__name__)

#: The cleanup delete runs shielded, for at most this long.
_CLEANUP_TIMEOUT: Final = 10.0


def probe_key(prefix: str = "") -> str:
    """A fresh, unique probe key under ``prefix`` (with or without a trailing ``/``)."""
    name = f"_edgegw-probe/{uuid.uuid4().hex}"
    return f"{prefix.rstrip('/')}/{name}" if prefix.strip("/") else name


async def verify_conditional_create(bucket: Bucket, prefix: str = "") -> None:
    """Require that ``bucket`` refuses a second create-only put of one key.

    Creates a fresh probe key under ``prefix`` with ``if_none_match=True``,
    creates it again with different content (which must fail with
    :class:`PreconditionFailed`), checks the first content survived, and
    deletes the key. Raises :class:`UnsupportedStore` naming the store if the
    second create succeeds or overwrote the object; bucket errors
    (:class:`BucketUnavailable`, :class:`AccessDenied`) propagate unchanged:
    the shipper runs the probe as part of its claim and retries the claim
    with backoff, so a store that is away or refuses the gateway at start
    is waited for, never a reason to stop.
    """
    key = probe_key(prefix)
    first = b"edgegw conditional-create probe: first writer\n"
    second = b"edgegw conditional-create probe: second writer\n"
    try:
        await bucket.put(key, first, if_none_match=True)
    except PreconditionFailed:
        # A client-side retry after a lost response gets 412 for its own
        # create; the content tells whether it was ours.
        if (await bucket.get(key)).data != first:
            raise
    try:
        try:
            await bucket.put(key, second, if_none_match=True)
        except PreconditionFailed:
            pass
        else:
            raise UnsupportedStore(
                f"{bucket.describe()} accepted a second create-only put of {key!r} "
                "(it ignores the create-only condition: If-None-Match: * on S3 and Azure, "
                "ifGenerationMatch=0 on GCS). Without conditional creates two gateways "
                "writing one region cannot be fenced, so edgegw refuses to run unfenced; "
                "use a store that enforces them (S3: If-None-Match on PutObject and "
                "CompleteMultipartUpload; docs/stores.md)."
            )
        if (await bucket.get(key)).data != first:
            raise UnsupportedStore(
                f"{bucket.describe()} answered 412 to a second create-only put of {key!r} "
                "but replaced the object anyway; conditional creates are not atomic there, "
                "so edgegw refuses to run unfenced."
            )
    finally:
        with trio.move_on_after(_CLEANUP_TIMEOUT, shield=True):
            try:
                await bucket.delete(key)
            except EdgeGatewayError as exc:
                # A leftover probe object is harmless; the verdict matters more.
                _log.warning("could not delete probe object %r in %s: %s", key, bucket.name, exc)
