#!/usr/bin/env bash
# The TypeScript cases of the Python-driven end-to-end tests: the
# TypeScript lead workflow example (clients/typescript/examples/lead_workflow.ts,
# plain and over TLS, its output checked against the same expected lines
# as the Python example's) and the MCP TypeScript SDK over stdio and streamable HTTP
# (clients/typescript/examples/mcp_e2e.ts), each against the built binary on
# a fresh server. Their Python cases ran in .ci/python-client.sh.
#
# Runs after .ci/python-client.sh (its venv, at $SUBAGENTD_CLIENT_VENV, has
# the installed wheel and the pinned test requirements) and
# .ci/typescript-client.sh (npm ci and tsc into clients/typescript/dist).
set -euo pipefail

# Always work from the repository root, wherever the script is called from.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# A venv with the package and the test requirements (.ci/run sets it).
PYTHON="${SUBAGENTD_CLIENT_VENV:?set SUBAGENTD_CLIENT_VENV to the venv .ci/python-client.sh made}/bin/python"

for need in target/debug/subagentd "$PYTHON" clients/typescript/dist/examples/lead_workflow.js; do
  if [ ! -e "$need" ]; then
    echo "clients-e2e: $need is missing (run .ci/python-client.sh and .ci/typescript-client.sh first)" >&2
    exit 1
  fi
done

echo "==> clients: the TypeScript lead workflow example, end to end"
SUBAGENTD_REQUIRE_TS=1 SUBAGENTD_BIN=target/debug/subagentd "$PYTHON" -W error::ResourceWarning \
  -m unittest -v -k typescript clients/python/tests/test_examples_e2e.py

echo "==> clients: the MCP TypeScript SDK over stdio and streamable HTTP, end to end"
SUBAGENTD_REQUIRE_TS=1 SUBAGENTD_BIN=target/debug/subagentd "$PYTHON" -W error::ResourceWarning \
  -m unittest -v -k TypeScriptSdk clients/python/tests/test_mcp_e2e.py
