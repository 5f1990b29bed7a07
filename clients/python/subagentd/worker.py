"""A subagentd worker: serve runs of some agent types from Python.

    from subagentd.worker import Worker, Run, RunFailed

    def handle(run: Run) -> str:
        run.output("looking at the repo\\n")
        run.tool_call("grep", input_digest="sha256:...")
        run.usage(input_tokens=1200, output_tokens=300)
        if not run.request_approval("shell", detail="make test").approved:
            raise RunFailed("DENIED", "not allowed to run tests")
        return "all tests pass"

    Worker("127.0.0.1:50051", agents=["coder"], capacity=4, handler=handle).run()

With `reconnect_delay` set, a session the server ends (a restart, a network
break) is opened again after that many seconds, for as long as it takes; runs
keep going meanwhile, their reports wait, and the new session's hello names
them (`held_runs`), so the server re-attaches each one it still has live and
cancels the rest. Without it, `run()` returns when the session ends.

Against a server that requires authentication, give the worker a key with the
`worker` role (`token=`, or the `SUBAGENTD_TOKEN` environment variable). It
serves only its key's tenant's runs. Over TLS, pass `ca_file=` (and for a
client-certificate principal `cert_file=` and `key_file=`), or set
`SUBAGENTD_CA_FILE`, `SUBAGENTD_CERT_FILE` and `SUBAGENTD_KEY_FILE`.

Every report of a run is numbered (`seq`) and kept until the server says the
run's end is durable (`released`): after a server crash, the next session
names the run and sends its reports again, and the server applies only those
its store did not keep, so nothing the handler reported is lost or counted
twice.

A continued agent's run (`SpawnRequest.continue_from`) carries the
conversation so far in `run.transcript` and the session this worker returned
for the previous turn in `run.previous_session`; set `run.session` to have the
next turn get yours.

Each assignment runs `handler(run)` on its own thread (at most `capacity` at
once, which is what the server assigns). The handler's return value is the
run's result; raising `RunFailed` (or any exception) fails the run. Blocking
calls on `Run` (`request_approval`, `next_steer`) raise `Cancelled` once the
server stops the run; long loops should check `run.cancelled`. Whatever the
handler does after a cancel, the library tells the server the run ended so the
worker's slot frees at once.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, TypeVar

import grpc

from subagents.v1 import subagents_pb2, workers_pb2

from . import _convert, client
from .types import Agent, TranscriptEntry

log = logging.getLogger("subagentd.worker")

T = TypeVar("T")

if TYPE_CHECKING:
    _Connect = grpc.StreamStreamMultiCallable[workers_pb2.ConnectRequest, workers_pb2.ConnectResponse]

__all__ = ["ApprovalOutcome", "Cancelled", "Run", "RunFailed", "Worker"]


class Cancelled(Exception):
    """The server stopped the run (cancel, deadline, parent ended)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class RunFailed(Exception):
    """Raise from a handler to fail the run with a code and message.

    ``retryable=True`` says the failure is a provider's that another model
    may not have (rate limit or quota exhausted, 5xx, overloaded, unknown
    model, missing credentials): with ``[agents.NAME] fallback_models`` the
    server moves the agent to the next model and assigns it again."""

    def __init__(self, code: str, message: str, retryable: bool = False):
        super().__init__(f"{code}: {message}")
        self.retryable = retryable
        self.code = code
        self.message = message


@dataclass(frozen=True)
class ApprovalOutcome:
    """The decision on an approval request."""

    approved: bool
    note: str
    approval_id: str


class Run:
    """One run the server assigned to this worker."""

    def __init__(self, assignment: workers_pb2.RunAssignment, send: Callable[[workers_pb2.RunEvent], None]):
        self.assignment = assignment
        #: The agent as the server showed it at assignment.
        self.agent: subagents_pb2.Agent = assignment.agent
        #: The agent id.
        self.id: str = assignment.agent.id
        #: The prompt.
        self.prompt: str = assignment.prompt
        #: W3C trace context of the run (always set; its trace id is the
        #: agent's ``trace_id``), to parent this worker's own spans.
        self.traceparent: str = assignment.traceparent
        #: A continuation's history (``SpawnRequest.continue_from``): the
        #: earlier turns' entries (prompts, steer messages, tool calls,
        #: results), oldest first, as ``subagents_pb2.TranscriptEntry``;
        #: empty for the first turn of a conversation.
        self.transcript: List[subagents_pb2.TranscriptEntry] = list(assignment.transcript)
        #: The same entries as ``subagentd.types.TranscriptEntry`` (what
        #: ``Client.transcript`` yields): enums and datetimes.
        self.history: List[TranscriptEntry] = [_convert.transcript_entry(e) for e in assignment.transcript]
        #: The agent as ``subagentd.types.Agent`` (what ``Client`` returns).
        self.agent_view: Agent = _convert.agent(assignment.agent)
        #: The session this worker returned for the previous turn (see
        #: ``session``), or "" when it returned none: resume it.
        self.previous_session: str = assignment.session
        #: This run's own session, returned with its end so that the run
        #: that continues this agent gets it as ``previous_session``. Set it
        #: any time before the handler returns (or raises).
        self.session: str = ""
        self._send = send
        self._steers: "queue.Queue[str]" = queue.Queue()
        for message in assignment.steer_messages:
            self._steers.put(message)
        self._approvals: "queue.Queue[ApprovalOutcome]" = queue.Queue()
        self._cancelled = threading.Event()
        self._cancel_reason = ""
        self._finished = False
        self._lock = threading.Lock()
        #: Every event sent, numbered from 1, until the server releases the
        #: run (sent again after a re-attach).
        self._sent: List[workers_pb2.RunEvent] = []

    # ----- reporting -------------------------------------------------------------

    def output(self, chunk: str) -> None:
        """Streams a chunk of output; chunks concatenate to the result so far."""
        self._event(output=chunk)

    def tool_call(self, name: str, input_digest: str = "") -> None:
        """Reports a tool call (counted in the agent's usage)."""
        self._event(tool_call=subagents_pb2.ToolCall(name=name, input_digest=input_digest))

    def turn_started(self) -> None:
        """Reports that the run starts a turn (one model call of its loop).

        With ``[agents.NAME] max_turns`` set, the server sends the type's
        wrap-up message as a steer (see ``next_steer``) when turn
        ``max_turns`` starts, to be the next turn's input, and stops the run
        (FAILED ``TURN_LIMIT``) when a turn past ``max_turns + grace_turns``
        starts."""
        self._event(turn_started=workers_pb2.TurnStarted())

    def usage(self, input_tokens: int = 0, output_tokens: int = 0) -> None:
        """Adds token usage to the agent."""
        self._event(usage=workers_pb2.TokenUsage(input_tokens=input_tokens, output_tokens=output_tokens))

    def request_approval(self, tool_name: str, detail: str = "", timeout: Optional[float] = None) -> ApprovalOutcome:
        """Pauses the run until someone approves or denies `tool_name`.

        The agent shows AWAITING_APPROVAL; after Approve it may wait for a slot
        before the decision arrives here. Raises `Cancelled` if the run is
        stopped meanwhile, `TimeoutError` after `timeout` seconds.
        """
        self._event(approval_request=workers_pb2.ApprovalRequest(tool_name=tool_name, detail=detail))
        return self._wait(self._approvals, timeout)

    # ----- steering and cancellation --------------------------------------------------

    def next_steer(self, timeout: Optional[float] = None) -> str:
        """The next steer message (buffered ones first); blocks until one
        arrives. Raises `Cancelled` if the run is stopped, `TimeoutError`
        after `timeout` seconds."""
        return self._wait(self._steers, timeout)

    def pending_steers(self) -> List[str]:
        """Steer messages that arrived and were not read yet."""
        out: List[str] = []
        while True:
            try:
                out.append(self._steers.get_nowait())
            except queue.Empty:
                return out

    @property
    def cancelled(self) -> bool:
        """Whether the server stopped this run."""
        return self._cancelled.is_set()

    @property
    def cancel_reason(self) -> str:
        """Why the server stopped this run (empty if it did not)."""
        return self._cancel_reason

    def wait_cancelled(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the run is stopped or `timeout` passes; True if stopped."""
        return self._cancelled.wait(timeout)

    # ----- internals ----------------------------------------------------------

    def _wait(self, q: "queue.Queue[T]", timeout: Optional[float]) -> T:
        deadline = None if timeout is None else _now() + timeout
        while True:
            if self._cancelled.is_set():
                raise Cancelled(self._cancel_reason)
            try:
                # Short waits so a cancel is noticed promptly.
                remaining = 0.1 if deadline is None else min(0.1, deadline - _now())
                if remaining <= 0:
                    raise TimeoutError("no message before the timeout")
                return q.get(timeout=remaining)
            except queue.Empty:
                continue

    def _event(self, **fields: Any) -> None:
        with self._lock:
            if self._finished:
                return
            if "done" in fields or "failed" in fields:
                self._finished = True
            event = workers_pb2.RunEvent(
                agent_id=self.id, attempt=self.agent.attempt, seq=len(self._sent) + 1, **fields
            )
            self._sent.append(event)
            # Under the lock: the server needs the numbers in order.
            self._send(event)


    def _cancel(self, reason: str) -> None:
        self._cancel_reason = reason
        self._cancelled.set()


def _now() -> float:
    import time

    return time.monotonic()


_REFUSALS = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
)


class Worker:
    """A worker session: connects, declares its agent types and capacity,
    and runs `handler(run)` for each assignment until `stop()` or the stream
    ends."""

    def __init__(
        self,
        target: str,
        agents: List[str],
        handler: Callable[[Run], str],
        capacity: int = 1,
        name: str = "",
        labels: Optional[Dict[str, str]] = None,
        channel: Optional[grpc.Channel] = None,
        reconnect_delay: Optional[float] = None,
        token: Optional[str] = None,
        ca_file: Optional[str] = None,
        cert_file: Optional[str] = None,
        key_file: Optional[str] = None,
    ):
        self.target = target
        #: The key sent on the session (None: `SUBAGENTD_TOKEN`, if set).
        self.token = token
        #: TLS: the CA and the client certificate (None: the
        #: `SUBAGENTD_CA_FILE`, `SUBAGENTD_CERT_FILE`, `SUBAGENTD_KEY_FILE`
        #: variables; plaintext without any). See `client.channel`.
        self.tls = (ca_file, cert_file, key_file)
        self.agents = list(agents)
        self.handler = handler
        self.capacity = capacity
        self.name = name
        self.labels = dict(labels or {})
        self._channel = channel
        self.reconnect_delay = reconnect_delay
        self._stopping = threading.Event()
        self._send_lock = threading.Lock()
        self._outgoing: "queue.Queue[Optional[workers_pb2.ConnectRequest]]" = queue.Queue()
        self._runs: Dict[str, Run] = {}
        self._runs_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max(1, capacity), thread_name_prefix="subagentd-run")
        self._call: Optional[Any] = None
        #: Set once the server answered the hello.
        self.ready = threading.Event()
        #: The server's id for this session (after `ready`).
        self.worker_id = ""

    def run(self) -> None:
        """Serves runs until `stop()` or the server ends the session (with
        `reconnect_delay`: until `stop()`). Raises `grpc.RpcError` if the
        server refuses the hello (INVALID_ARGUMENT) or the credential
        (UNAUTHENTICATED, PERMISSION_DENIED) or, without
        `reconnect_delay`, the connection fails."""
        ca_file, cert_file, key_file = self.tls
        channel = self._channel or client.channel(
            self.target, self.token, ca_file=ca_file, cert_file=cert_file, key_file=key_file
        )
        connect: "_Connect" = channel.stream_stream(
            "/subagents.v1.WorkerService/Connect",
            request_serializer=workers_pb2.ConnectRequest.SerializeToString,
            response_deserializer=workers_pb2.ConnectResponse.FromString,
        )
        try:
            while True:
                try:
                    self._session(connect)
                except grpc.RpcError as e:
                    code = e.code()
                    if code == grpc.StatusCode.CANCELLED and self._stopping.is_set():
                        return
                    # A refused hello or credential is not fixed by retrying.
                    if self.reconnect_delay is None or code in _REFUSALS:
                        if code == grpc.StatusCode.CANCELLED:
                            return
                        raise
                    log.warning("session ended (%s); reconnecting in %.1f s", code, self.reconnect_delay)
                else:
                    if self.reconnect_delay is None or self._stopping.is_set():
                        return
                    log.warning("session ended; reconnecting in %.1f s", self.reconnect_delay)
                self.ready.clear()
                if self._stopping.wait(self.reconnect_delay):
                    return
        finally:
            self._outgoing.put(None)
            with self._runs_lock:
                runs = list(self._runs.values())
            for r in runs:
                r._cancel("worker session ended")
            self._pool.shutdown(wait=False)
            if self._channel is None:
                channel.close()

    def _session(self, connect: _Connect) -> None:
        """One session: the hello (naming the runs still held), then
        commands until the stream ends. Reports made while no session was
        open are sent after the hello."""
        with self._runs_lock:
            runs = sorted(self._runs.values(), key=lambda r: r.id)
        hello = workers_pb2.WorkerHello(
            name=self.name,
            agents=self.agents,
            capacity=self.capacity,
            labels=self.labels,
            held_runs=[workers_pb2.HeldRun(agent_id=r.id, attempt=r.agent.attempt) for r in runs],
        )
        # Every held run's lock, then the send lock (the order `_event`
        # takes them in), so no report slips in between: the new session
        # gets the hello, then each held run's reports in order — all of
        # them, the server skips what its store kept — then new ones. A
        # queue per session: the last session's request iterator may still
        # be reading its own; what it did not send is in the runs' reports.
        for r in runs:
            r._lock.acquire()
        try:
            with self._send_lock:
                previous = self._outgoing
                outgoing: "queue.Queue[Optional[workers_pb2.ConnectRequest]]" = queue.Queue()
                self._outgoing = outgoing
                previous.put(None)
                outgoing.put(workers_pb2.ConnectRequest(hello=hello))
                for r in runs:
                    for event in r._sent:
                        outgoing.put(workers_pb2.ConnectRequest(event=event))
        finally:
            for r in reversed(runs):
                r._lock.release()
        self._call = connect(self._requests(outgoing))
        for response in self._call:
            self._dispatch(response)

    def stop(self) -> None:
        """Ends the session; the server treats the worker as gone."""
        self._stopping.set()
        self._outgoing.put(None)
        if self._call is not None:
            self._call.cancel()

    def _requests(
        self, outgoing: "queue.Queue[Optional[workers_pb2.ConnectRequest]]"
    ) -> Iterator[workers_pb2.ConnectRequest]:
        while True:
            item = outgoing.get()
            if item is None:
                return
            yield item

    def _send(self, event: workers_pb2.RunEvent) -> None:
        with self._send_lock:
            self._outgoing.put(workers_pb2.ConnectRequest(event=event))

    def _dispatch(self, response: workers_pb2.ConnectResponse) -> None:
        kind = response.WhichOneof("message")
        if kind == "welcome":
            self.worker_id = response.welcome.worker_id
            self.ready.set()
            log.info("connected as %s", self.worker_id)
        elif kind == "assign":
            assigned = Run(response.assign, self._send)
            with self._runs_lock:
                self._runs[assigned.id] = assigned
            self._pool.submit(self._execute, assigned)
        elif kind == "steer":
            run = self._run(response.steer.agent_id)
            if run is not None:
                run._steers.put(response.steer.message)
        elif kind == "cancel":
            run = self._run(response.cancel.agent_id)
            if run is not None:
                run._cancel(response.cancel.reason)
                if run._finished:
                    # A finished run the server no longer has live: its end
                    # is durable already (or the run was cancelled).
                    self._forget(run.id, run.agent.attempt)
        elif kind == "released":
            self._forget(response.released.agent_id, response.released.attempt)
        elif kind == "approval":
            a = response.approval
            run = self._run(a.agent_id)
            if run is not None:
                run._approvals.put(ApprovalOutcome(approved=a.approved, note=a.note, approval_id=a.approval_id))

    def _run(self, agent_id: str) -> Optional[Run]:
        with self._runs_lock:
            return self._runs.get(agent_id)

    def _forget(self, agent_id: str, attempt: int) -> None:
        """Drops the run of `agent_id` if it is that attempt (a newer one
        may have been assigned since)."""
        with self._runs_lock:
            run = self._runs.get(agent_id)
            if run is not None and run.agent.attempt == attempt:
                del self._runs[agent_id]

    def _execute(self, run: Run) -> None:
        try:
            result = self.handler(run)
            if run.cancelled:
                # Confirms the stop so the server frees the slot at once.
                run._event(failed=workers_pb2.RunFailed(code="CANCELLED", message=run.cancel_reason, session=run.session))
            else:
                run._event(done=workers_pb2.RunDone(result=result if isinstance(result, str) else str(result), session=run.session))
        except Cancelled as e:
            run._event(failed=workers_pb2.RunFailed(code="CANCELLED", message=e.reason, session=run.session))
        except RunFailed as e:
            run._event(
                failed=workers_pb2.RunFailed(code=e.code, message=e.message, session=run.session, retryable=e.retryable)
            )
        except Exception as e:  # the handler's bug is the run's failure
            log.exception("run %s failed", run.id)
            run._event(failed=workers_pb2.RunFailed(code="WORKER_EXCEPTION", message=f"{type(e).__name__}: {e}", session=run.session))
        # The run stays held until the server releases it (see `released`).
