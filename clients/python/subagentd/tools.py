"""subagentd's lead tools for your own model loop (`pip install 'subagentd[tools]'`).

    from subagentd.tools import LeadTools

    with LeadTools("http://127.0.0.1:50080/mcp", lead_id="lead-1") as tools:
        reply = chat(messages, tools=tools.openai())       # your model call
        for call in reply.tool_calls:
            result = tools.call(call.function.name, call.function.arguments, tool_call_id=call.id)
            messages.append(result.openai_message())       # result.text, result.is_error

The tools (`agent_spawn`, `agent_await`, …) are read from the server's MCP
endpoint (`tools/list` on `/mcp`), so their schemas are the server's own,
the agent types its config's; a call goes to the same endpoint, so what
it does and the text the model reads are the server's too: nothing here
knows what a tool does. `openai()` gives them as OpenAI chat-completions
tools (strict mode: the schemas are written for it), `anthropic()` as
Anthropic Messages tools. `call()` passes the model's tool-call id as
`_meta["subagentd/toolCallId"]`, so a retried `agent_spawn` returns the
agent the first one started instead of starting a second.

A refusal (a limit reached, an unknown agent type, …) and a malformed call
(invalid JSON, an unknown argument or tool) come back as a `ToolResult`
with `is_error=True` and the text that says why, for the model to read.
A refused credential raises `subagentd.errors.Unauthenticated` (HTTP 401)
or `PermissionDenied` (403); a server that cannot be reached raises the
HTTP client's error.

`LeadTools` is synchronous (it runs the MCP client on an event loop of its
own, in a thread); `AsyncLeadTools` is the same for asyncio code (`async
with AsyncLeadTools(url) as tools`). Both need the `tools` extra: the
official MCP Python SDK (`mcp`).
"""

from __future__ import annotations

import copy
import json
import os
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Dict, List, Mapping, Optional, Tuple, Type, Union, cast
from urllib.parse import urlsplit, urlunsplit

try:
    import anyio
    import anyio.from_thread
    import httpx2
    from mcp import Client as _McpClient
    from mcp import MCPError
    from mcp.client.streamable_http import streamable_http_client
    from mcp_types import INVALID_PARAMS
except ImportError as _missing:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"subagentd.tools needs the MCP Python SDK ({_missing}): pip install 'subagentd[tools]'"
    ) from _missing

import grpc

from . import errors

__all__ = ["AsyncLeadTools", "LeadTools", "Tool", "ToolResult", "TOOL_CALL_ID_META"]

#: The `_meta` key of a tool call that names the model's tool call (docs/mcp.md).
TOOL_CALL_ID_META = "subagentd/toolCallId"
#: The header that names the lead the tools act for.
LEAD_ID_HEADER = "subagentd-lead-id"

Arguments = Union[Mapping[str, Any], str, None]


@dataclass(frozen=True)
class Tool:
    """One tool as the server lists it."""

    name: str
    description: str
    #: The JSON Schema of its arguments (strict-mode ready: every property
    #: required, optional ones nullable, no additional properties).
    input_schema: Dict[str, Any]
    #: The JSON Schema of its structured result, if it declares one.
    output_schema: Optional[Dict[str, Any]] = None

    def openai(self, *, strict: bool = True) -> Dict[str, Any]:
        """An OpenAI chat-completions tool (`tools=[…]`)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": copy.deepcopy(self.input_schema),
                "strict": strict,
            },
        }

    def anthropic(self) -> Dict[str, Any]:
        """An Anthropic Messages tool (`tools=[…]`)."""
        return {"name": self.name, "description": self.description, "input_schema": copy.deepcopy(self.input_schema)}


@dataclass(frozen=True)
class ToolResult:
    """What a tool call returned."""

    name: str
    #: What the model should read: the result's text content.
    text: str
    #: True for a refusal or a malformed call (the text says why).
    is_error: bool
    #: The result's structured content (agent_spawn, agent_status, …), if any.
    structured: Optional[Any] = None
    tool_call_id: Optional[str] = None

    def openai_message(self) -> Dict[str, Any]:
        """The chat-completions message that answers the tool call."""
        return {"role": "tool", "tool_call_id": self.tool_call_id or "", "content": self.text}

    def anthropic_block(self) -> Dict[str, Any]:
        """The Anthropic `tool_result` content block that answers the tool use."""
        return {"type": "tool_result", "tool_use_id": self.tool_call_id or "", "content": self.text, "is_error": self.is_error}


def _endpoint(url: str) -> str:
    """`url`, with `/mcp` as its path when it has none."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"the MCP endpoint must be an http:// or https:// URL, not {url!r}")
    if parts.path in ("", "/"):
        parts = parts._replace(path="/mcp")
    return urlunsplit(parts)


def _leaf(exc: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups."""
    while True:
        inner = getattr(exc, "exceptions", None)
        if not inner:
            return exc
        exc = inner[0]


def _arguments(arguments: Arguments) -> Tuple[Optional[Dict[str, Any]], str]:
    """The arguments as a dict, or None and why they are not one."""
    if arguments is None:
        return {}, ""
    if isinstance(arguments, str):
        if not arguments.strip():
            return {}, ""
        try:
            arguments = json.loads(arguments)
        except ValueError as e:
            return None, f"the arguments are not valid JSON ({e})"
    if not isinstance(arguments, Mapping):
        return None, f"the arguments must be a JSON object, not {type(arguments).__name__}"
    return dict(arguments), ""


class AsyncLeadTools:
    """The lead tools of the subagentd server at `url` (its MCP endpoint,
    e.g. `http://127.0.0.1:50080/mcp`; a URL without a path gets `/mcp`),
    for asyncio code.

    `token` is sent as `Authorization: Bearer <token>` (default: the
    `SUBAGENTD_TOKEN` environment variable; none when empty); `lead_id` as
    the `subagentd-lead-id` header (default: `SUBAGENTD_LEAD_ID`; without
    one the server picks the lead from the credential). `timeout` bounds
    connecting and sending; `read_timeout` waiting for an answer (an
    agent_await waits up to the server's `[mcp] max_await`, 50 s by default).

    `await connect()` (or `async with`) opens the MCP session and lists the
    tools; `close()` ends it, in the same task."""

    def __init__(
        self,
        url: str,
        token: Optional[str] = None,
        lead_id: Optional[str] = None,
        *,
        timeout: float = 30.0,
        read_timeout: float = 300.0,
    ) -> None:
        self.url = _endpoint(url)
        token = (token if token is not None else os.environ.get("SUBAGENTD_TOKEN", "")).strip()
        lead_id = lead_id if lead_id is not None else os.environ.get("SUBAGENTD_LEAD_ID", "")
        self.lead_id: Optional[str] = lead_id or None
        self._headers: Dict[str, str] = {}
        if token:
            self._headers["authorization"] = f"Bearer {token}"
        if self.lead_id:
            self._headers[LEAD_ID_HEADER] = self.lead_id
        self._timeout = httpx2.Timeout(timeout, read=read_timeout)
        self._read_timeout = read_timeout
        self._stack: Optional[AsyncExitStack] = None
        self._client: Optional[_McpClient] = None
        self._tools: Optional[List[Tool]] = None
        # The last refused HTTP request's status and body (401, 403).
        self._refused: Optional[Tuple[int, str]] = None

    # ----- lifecycle --------------------------------------------------------------

    async def connect(self) -> "AsyncLeadTools":
        """Opens the MCP session and lists the tools (once)."""
        if self._client is not None:
            return self
        stack = AsyncExitStack()
        try:
            http = await stack.enter_async_context(
                httpx2.AsyncClient(headers=self._headers, timeout=self._timeout, event_hooks={"response": [self._on_response]})
            )
            transport = streamable_http_client(self.url, http_client=http)
            client = await stack.enter_async_context(_McpClient(transport, read_timeout_seconds=self._read_timeout))
            self._tools = await self._list(client)
        except Exception as e:
            await stack.aclose()
            error = self._error(e)
            if error is e:
                raise
            raise error from e
        except BaseException:
            await stack.aclose()
            raise
        self._stack, self._client = stack, client
        return self

    async def close(self) -> None:
        """Ends the MCP session."""
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    async def __aenter__(self) -> "AsyncLeadTools":
        return await self.connect()

    async def __aexit__(
        self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        await self.close()

    async def _on_response(self, response: httpx2.Response) -> None:
        if response.status_code in (401, 403):
            await response.aread()
            self._refused = (response.status_code, response.text.strip())

    def _error(self, e: Exception) -> BaseException:
        """What to raise for a failure: a refused credential as subagentd's error."""
        if self._refused is not None:
            status, body = self._refused
            message = body or f"HTTP {status} from {self.url}"
            if status == 401:
                return errors.Unauthenticated(message, code=grpc.StatusCode.UNAUTHENTICATED)
            return errors.PermissionDenied(message, code=grpc.StatusCode.PERMISSION_DENIED)
        return _leaf(e)

    @property
    def _session(self) -> _McpClient:
        if self._client is None:
            raise RuntimeError("AsyncLeadTools is not connected: use `async with` or `await connect()`")
        return self._client

    # ----- the tools ----------------------------------------------------------------

    @staticmethod
    async def _list(client: _McpClient) -> List[Tool]:
        tools: List[Tool] = []
        cursor: Optional[str] = None
        while True:
            page = await client.list_tools(cursor=cursor, cache_mode="refresh")
            tools += [
                Tool(
                    name=t.name,
                    description=t.description or "",
                    input_schema=dict(t.input_schema),
                    output_schema=dict(t.output_schema) if t.output_schema is not None else None,
                )
                for t in page.tools
            ]
            cursor = page.next_cursor
            if cursor is None:
                return tools

    @property
    def tools(self) -> List[Tool]:
        """The tools as the server listed them, in its order."""
        if self._tools is None:
            raise RuntimeError("AsyncLeadTools is not connected: use `async with` or `await connect()`")
        return list(self._tools)

    async def refresh(self) -> List[Tool]:
        """Lists the tools again (the agent types change with the server's config)."""
        self._tools = await self._list(self._session)
        return self.tools

    def openai(self, *, strict: bool = True) -> List[Dict[str, Any]]:
        """The tools as OpenAI chat-completions tools."""
        return [t.openai(strict=strict) for t in self.tools]

    def anthropic(self) -> List[Dict[str, Any]]:
        """The tools as Anthropic Messages tools."""
        return [t.anthropic() for t in self.tools]

    @property
    def agent_types(self) -> List[str]:
        """The agent types agent_spawn offers (its `agent` enum)."""
        for t in self.tools:
            if t.name == "agent_spawn":
                enum = t.input_schema.get("properties", {}).get("agent", {}).get("enum", [])
                return [v for v in enum if isinstance(v, str)]
        return []

    async def call(self, name: str, arguments: Arguments = None, *, tool_call_id: Optional[str] = None) -> ToolResult:
        """Calls tool `name` with `arguments` (a dict, or the model's JSON
        string) on the server. `tool_call_id` (the model's id of the call)
        makes a retried agent_spawn return the first call's agent."""
        session = self._session
        args, why = _arguments(arguments)
        if args is None:
            return ToolResult(name, f"Invalid call of {name}: {why}.", True, None, tool_call_id)
        meta = cast(Any, {TOOL_CALL_ID_META: tool_call_id}) if tool_call_id else None
        try:
            result = await session.call_tool(name, args, meta=meta)
        except MCPError as e:
            if e.code != INVALID_PARAMS:
                raise
            # A malformed call (an unknown tool or argument, a wrong type): the model can fix it.
            return ToolResult(name, f"Invalid call of {name}: {e.message}", True, None, tool_call_id)
        text = "\n".join(block.text for block in result.content if block.type == "text")
        return ToolResult(name, text, result.is_error, result.structured_content, tool_call_id)


class LeadTools:
    """`AsyncLeadTools` for synchronous code: the same arguments and methods,
    blocking. It connects (and lists the tools) when made; `close()` (or
    leaving a `with` block) ends the session and its event loop thread."""

    def __init__(
        self,
        url: str,
        token: Optional[str] = None,
        lead_id: Optional[str] = None,
        *,
        timeout: float = 30.0,
        read_timeout: float = 300.0,
    ) -> None:
        self._async = AsyncLeadTools(url, token, lead_id, timeout=timeout, read_timeout=read_timeout)
        self._stack = ExitStack()
        try:
            self._portal = self._stack.enter_context(anyio.from_thread.start_blocking_portal())
            self._stack.enter_context(self._portal.wrap_async_context_manager(self._async))
        except BaseException:
            self._stack.close()
            raise

    @property
    def url(self) -> str:
        return self._async.url

    @property
    def lead_id(self) -> Optional[str]:
        return self._async.lead_id

    def close(self) -> None:
        """Ends the MCP session and stops the event loop thread."""
        self._stack.close()

    def __enter__(self) -> "LeadTools":
        return self

    def __exit__(
        self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        self.close()

    @property
    def tools(self) -> List[Tool]:
        """The tools as the server listed them, in its order."""
        return self._async.tools

    def refresh(self) -> List[Tool]:
        """Lists the tools again (the agent types change with the server's config)."""
        return self._portal.call(self._async.refresh)

    def openai(self, *, strict: bool = True) -> List[Dict[str, Any]]:
        """The tools as OpenAI chat-completions tools."""
        return self._async.openai(strict=strict)

    def anthropic(self) -> List[Dict[str, Any]]:
        """The tools as Anthropic Messages tools."""
        return self._async.anthropic()

    @property
    def agent_types(self) -> List[str]:
        """The agent types agent_spawn offers (its `agent` enum)."""
        return self._async.agent_types

    def call(self, name: str, arguments: Arguments = None, *, tool_call_id: Optional[str] = None) -> ToolResult:
        """Calls tool `name` with `arguments` (a dict, or the model's JSON
        string); see `AsyncLeadTools.call`."""

        async def call() -> ToolResult:
            return await self._async.call(name, arguments, tool_call_id=tool_call_id)

        return self._portal.call(call)
