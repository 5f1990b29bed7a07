#!/usr/bin/env bash
# Client examples end to end: the Python and TypeScript lead workflow examples
# (clients/python/examples/lead_workflow.py, clients/typescript/src/lead_workflow.ts)
# against the built binary, each on a fresh server; then the MCP TypeScript SDK
# over stdio and streamable HTTP (clients/typescript/src/mcp_e2e.ts, run by
# clients/python/tests/test_mcp_e2e.py; its Python cases ran in step 9).
#
# Runs after step 8 of .ci/run, which builds target/debug/subagentd and
# creates .ci/venv with the pinned requirements and ./clients/python installed.
set -euo pipefail

# Always work from the repository root, wherever the script is called from.
cd "$(dirname "${BASH_SOURCE[0]}")/.."

for need in target/debug/subagentd .ci/venv/bin/python; do
  if [ ! -x "$need" ]; then
    echo "clients-e2e: $need is missing (run .ci/run steps 7 and 8 first)" >&2
    exit 1
  fi
done

echo "==> clients: npm ci --prefix clients/typescript (pinned in package-lock.json)"
# Exactly the locked versions, into clients/typescript/node_modules (gitignored).
# Nothing installed needs an install script (protobufjs's only checks its CLI).
npm ci --prefix clients/typescript --ignore-scripts --no-audit --no-fund

echo "==> clients: tsc (type check and build clients/typescript/dist)"
npm run --prefix clients/typescript build

echo "==> clients: lead workflow examples, Python and TypeScript, end to end"
SUBAGENTD_REQUIRE_TS=1 SUBAGENTD_BIN=target/debug/subagentd .ci/venv/bin/python -W error::ResourceWarning \
  -m unittest -v clients/python/tests/test_examples_e2e.py

echo "==> clients: the MCP TypeScript SDK over stdio and streamable HTTP, end to end"
SUBAGENTD_REQUIRE_TS=1 SUBAGENTD_BIN=target/debug/subagentd .ci/venv/bin/python -W error::ResourceWarning \
  -m unittest -v -k TypeScriptSdk clients/python/tests/test_mcp_e2e.py
