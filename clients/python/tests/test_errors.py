"""The error table: every ErrorInfo reason the server sends has its class,
and a status's details become typed attributes. No server needed.

The server's reasons are read from src/api/status.rs (the repository is
found from this file's path, or SUBAGENTD_REPO).
"""

import os
import re
import unittest
from datetime import timedelta
from pathlib import Path

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

from subagentd import errors
from subagentd.types import AgentStatus

REPO = Path(os.environ.get("SUBAGENTD_REPO") or Path(__file__).resolve().parents[3])
STATUS_RS = REPO / "src" / "api" / "status.rs"


class FakeError(grpc.RpcError):
    """A grpc error as grpcio raises it: code, details, trailers."""

    def __init__(self, code: grpc.StatusCode, message: str, *details) -> None:
        super().__init__(message)
        self._code, self._message = code, message
        status = status_pb2.Status(code=code.value[0], message=message)
        for detail in details:
            packed = any_pb2.Any()
            packed.Pack(detail)
            status.details.append(packed)
        self._trailers = (("grpc-status-details-bin", status.SerializeToString()),) if details else ()

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._message

    def trailing_metadata(self):
        return self._trailers


def info(reason: str, **metadata: str) -> error_details_pb2.ErrorInfo:
    return error_details_pb2.ErrorInfo(reason=reason, domain="subagentd", metadata=metadata)


class ErrorTableTest(unittest.TestCase):
    def test_every_reason_the_server_sends_has_a_class(self) -> None:
        self.assertTrue(STATUS_RS.is_file(), f"{STATUS_RS} not found (set SUBAGENTD_REPO to the repository)")
        reasons = re.findall(r'pub const REASON_\w+: &str = "([A-Z_]+)";', STATUS_RS.read_text())
        self.assertGreaterEqual(len(reasons), 20, "the REASON_* constants were not found")
        unmapped = sorted(set(reasons) - set(errors.ERRORS))
        self.assertEqual(unmapped, [], f"reasons the server sends that subagentd.errors does not map: {unmapped}")
        for reason, cls in errors.ERRORS.items():
            self.assertEqual(cls.REASON, reason)
            self.assertTrue(issubclass(cls, errors.SubagentdError))

    def test_metadata_become_typed_attributes(self) -> None:
        err = errors.from_rpc_error(
            FakeError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "global limit",
                info("GLOBAL_LIMIT_REACHED", limit="5", live="5", config_key="limits.max_background_agents"),
            )
        )
        self.assertIsInstance(err, errors.GlobalLimitReached)
        assert isinstance(err, errors.GlobalLimitReached)
        self.assertEqual((err.limit, err.live, err.config_key), (5, 5, "limits.max_background_agents"))
        self.assertEqual((err.code, err.message, err.reason), (grpc.StatusCode.RESOURCE_EXHAUSTED, "global limit", "GLOBAL_LIMIT_REACHED"))
        self.assertEqual(err.metadata["limit"], "5")

        busy = errors.from_rpc_error(
            FakeError(grpc.StatusCode.FAILED_PRECONDITION, "busy", info("AGENT_BUSY", id="a1", status="AGENT_STATUS_RUNNING"))
        )
        assert isinstance(busy, errors.AgentBusy)
        self.assertEqual((busy.id, busy.status), ("a1", AgentStatus.RUNNING))

        denied = errors.from_rpc_error(
            FakeError(grpc.StatusCode.PERMISSION_DENIED, "no", info("PERMISSION_DENIED", required_roles="admin,frontend"))
        )
        assert isinstance(denied, errors.PermissionDenied)
        self.assertEqual(denied.required_roles, ["admin", "frontend"])

        limited = errors.from_rpc_error(
            FakeError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "slow down",
                info("RATE_LIMITED", tenant="t", spawn_rate="1/s", spawn_burst="3"),
                error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=2)),
            )
        )
        assert isinstance(limited, errors.RateLimited)
        self.assertEqual((limited.spawn_burst, limited.retry_after), (3, timedelta(seconds=2)))

        invalid = errors.from_rpc_error(
            FakeError(
                grpc.StatusCode.INVALID_ARGUMENT,
                "bad",
                info("INVALID_REQUEST"),
                error_details_pb2.BadRequest(
                    field_violations=[error_details_pb2.BadRequest.FieldViolation(field="prompt", description="empty")]
                ),
            )
        )
        assert isinstance(invalid, errors.InvalidRequest)
        self.assertEqual(invalid.violations, [("prompt", "empty")])

    def test_statuses_without_error_info_get_transport_classes(self) -> None:
        for code, cls in [
            (grpc.StatusCode.UNAVAILABLE, errors.Unavailable),
            (grpc.StatusCode.DEADLINE_EXCEEDED, errors.DeadlineExceeded),
            (grpc.StatusCode.CANCELLED, errors.Cancelled),
        ]:
            err = errors.from_rpc_error(FakeError(code, "transport"))
            self.assertIs(type(err), cls)
            self.assertEqual((err.code, err.reason), (code, ""))
        other = errors.from_rpc_error(FakeError(grpc.StatusCode.INTERNAL, "boom"))
        self.assertIs(type(other), errors.SubagentdError)
        # A reason from a newer server: the base class, the reason kept.
        newer = errors.from_rpc_error(FakeError(grpc.StatusCode.ABORTED, "new", info("SOMETHING_NEW", k="v")))
        self.assertIs(type(newer), errors.SubagentdError)
        self.assertEqual((newer.reason, newer.metadata), ("SOMETHING_NEW", {"k": "v"}))

    def test_no_leader_and_recovering_are_unavailable(self) -> None:
        for reason, cls in [("NO_LEADER", errors.NoLeader), ("RECOVERING", errors.Recovering)]:
            err = errors.from_rpc_error(FakeError(grpc.StatusCode.UNAVAILABLE, "wait", info(reason)))
            self.assertIs(type(err), cls)
            self.assertIsInstance(err, errors.Unavailable)


if __name__ == "__main__":
    unittest.main()
