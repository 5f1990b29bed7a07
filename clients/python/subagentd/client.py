"""Reading subagentd's structured errors.

Every error status subagentd returns carries a `google.rpc.Status` in the
`grpc-status-details-bin` trailer, whose details hold a `google.rpc.ErrorInfo`
(domain "subagentd") and, depending on the error, `BadRequest`,
`QuotaFailure`, `PreconditionFailure` or `ResourceInfo`. Branch on
`ErrorInfo.reason` (see the table in docs/errors.md), never on the message:

    from subagentd.client import error_info

    try:
        agents.Spawn(request)
    except grpc.RpcError as err:
        info = error_info(err)
        if info is not None and info.reason == "GLOBAL_LIMIT_REACHED":
            print(info.metadata["limit"], info.metadata["live"])

With authentication (`[auth] mode = "required"`), open channels with
`channel(target)`: it sends the key in `SUBAGENTD_TOKEN` (or the `token`
given) as `authorization: Bearer <key>` on every call.

Needs `grpcio-status` (which brings `googleapis-common-protos`).
"""

import os
from typing import List, Optional

import grpc
from google.protobuf import message as _message
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

__all__ = ["DOMAIN", "channel", "error_details", "error_info", "error_reason", "rich_status"]

DOMAIN = "subagentd"

# Detail types subagentd sends, by their Any type name.
_DETAIL_TYPES = {
    cls.DESCRIPTOR.full_name: cls
    for cls in (
        error_details_pb2.ErrorInfo,
        error_details_pb2.BadRequest,
        error_details_pb2.QuotaFailure,
        error_details_pb2.PreconditionFailure,
        error_details_pb2.ResourceInfo,
        error_details_pb2.RetryInfo,
        error_details_pb2.DebugInfo,
        error_details_pb2.Help,
        error_details_pb2.LocalizedMessage,
    )
}


class _Bearer(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds `authorization: Bearer <token>` to every call."""

    def __init__(self, token: str):
        self._header = ("authorization", f"Bearer {token}")

    def _with_token(self, details):
        metadata = list(details.metadata or []) + [self._header]
        return details._replace(metadata=metadata)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._with_token(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._with_token(details), requests)


def _read(path: Optional[str]) -> Optional[bytes]:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


def channel(
    target: str,
    token: Optional[str] = None,
    ca_file: Optional[str] = None,
    cert_file: Optional[str] = None,
    key_file: Optional[str] = None,
) -> grpc.Channel:
    """A channel to subagentd at `target` ("host:port") whose calls carry
    `token` — by default the `SUBAGENTD_TOKEN` environment variable; none
    when both are empty (a server without authentication).

    With `ca_file` (PEM; default `SUBAGENTD_CA_FILE`) the channel is TLS,
    verifying the server with that CA; `cert_file` and `key_file` (default
    `SUBAGENTD_CERT_FILE`, `SUBAGENTD_KEY_FILE`) add a client certificate
    (mTLS). Without any of them the channel is plaintext."""
    if token is None:
        token = os.environ.get("SUBAGENTD_TOKEN", "")
    ca_file = ca_file if ca_file is not None else os.environ.get("SUBAGENTD_CA_FILE")
    cert_file = cert_file if cert_file is not None else os.environ.get("SUBAGENTD_CERT_FILE")
    key_file = key_file if key_file is not None else os.environ.get("SUBAGENTD_KEY_FILE")
    if bool(cert_file) != bool(key_file):
        raise ValueError("cert_file and key_file go together")
    if ca_file or cert_file:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(ca_file),
            private_key=_read(key_file),
            certificate_chain=_read(cert_file),
        )
        base = grpc.secure_channel(target, credentials)
    else:
        base = grpc.insecure_channel(target)
    token = token.strip()
    if not token:
        return base
    return grpc.intercept_channel(base, _Bearer(token))


def rich_status(err: grpc.RpcError) -> Optional[status_pb2.Status]:
    """The `google.rpc.Status` from the error's `grpc-status-details-bin`
    trailer, or None when it has none (e.g. a transport error)."""
    if not isinstance(err, grpc.Call):
        return None
    return rpc_status.from_call(err)


def error_details(err: grpc.RpcError) -> List[_message.Message]:
    """The status details, unpacked (ErrorInfo, QuotaFailure, …) in the order
    sent. Details of unknown types are left out."""
    status = rich_status(err)
    if status is None:
        return []
    out = []
    for any_detail in status.details:
        cls = _DETAIL_TYPES.get(any_detail.TypeName())
        if cls is not None:
            detail = cls()
            any_detail.Unpack(detail)
            out.append(detail)
    return out


def error_info(err: grpc.RpcError) -> Optional[error_details_pb2.ErrorInfo]:
    """The error's `google.rpc.ErrorInfo`, or None when it carries none."""
    for detail in error_details(err):
        if isinstance(detail, error_details_pb2.ErrorInfo):
            return detail
    return None


def error_reason(err: grpc.RpcError) -> Optional[str]:
    """`ErrorInfo.reason` of a subagentd error (e.g. "GLOBAL_LIMIT_REACHED"),
    or None when the error carries no ErrorInfo from subagentd."""
    info = error_info(err)
    if info is None or info.domain != DOMAIN:
        return None
    return info.reason
