#!/usr/bin/env bash
# The Python package as a user gets it: build the sdist from clients/python,
# build the wheel from that sdist alone (no checkout: the sdist carries the
# .proto files), install the wheel into a fresh venv outside the repository
# (without grpcio-tools: no compiler at install or import), type-check the
# installed package and the examples with mypy --strict, and run the
# client's tests against the installed wheel from outside the repository,
# so `import subagentd` cannot pick up the source tree.
#
# Needs target/debug/subagentd (`cargo build --bins`). Pins:
# clients/python/requirements-ci.txt, requirements-mcp.txt,
# requirements-typing.txt. Set SUBAGENTD_TEST_POSTGRES (eval "$(bash
# .ci/postgres.sh start)") to run the PostgreSQL cases too.
set -euo pipefail

# Always work from the repository root, wherever the script is called from.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$(pwd)"
PY="${PYTHON:-python3}"

if [ ! -x target/debug/subagentd ]; then
  echo "python-client: target/debug/subagentd is missing (cargo build --bins)" >&2
  exit 1
fi

WORK="$(mktemp -d -t subagentd-pyclient.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
PIP=(--quiet --disable-pip-version-check)

echo "==> python-client: build tools into $WORK/build-venv"
"$PY" -m venv "$WORK/build-venv"
"$WORK/build-venv/bin/pip" install "${PIP[@]}" \
  -r clients/python/requirements-ci.txt -r clients/python/requirements-typing.txt

echo "==> python-client: sdist from clients/python"
# Without build isolation: the pinned setuptools and grpcio-tools build it.
"$WORK/build-venv/bin/python" -m build --no-isolation --sdist --outdir "$WORK/dist" clients/python >"$WORK/build.log" 2>&1 \
  || { cat "$WORK/build.log" >&2; exit 1; }
SDIST="$(ls "$WORK"/dist/subagentd-*.tar.gz)"
tar tzf "$SDIST" >"$WORK/sdist.txt"
grep -q '/proto/subagents/v1/subagents.proto$' "$WORK/sdist.txt" \
  || { echo "python-client: the sdist carries no proto/subagents/v1/subagents.proto" >&2; exit 1; }

echo "==> python-client: wheel from the sdist alone (outside the repository)"
(cd "$WORK" && "$WORK/build-venv/bin/python" -m build --no-isolation --wheel --outdir "$WORK/dist" "$SDIST" \
  >>"$WORK/build.log" 2>&1) || { cat "$WORK/build.log" >&2; exit 1; }
WHEEL="$(ls "$WORK"/dist/subagentd-*.whl)"
unzip -l "$WHEEL" >"$WORK/wheel.txt"
grep -q 'subagents/v1/subagents_pb2.py$' "$WORK/wheel.txt" \
  || { echo "python-client: the wheel holds no generated subagents_pb2.py" >&2; exit 1; }

# The test venv: under $WORK (removed on exit), or at $SUBAGENTD_CLIENT_VENV
# (outside the repository; kept, so .ci/clients-e2e.sh runs in it too).
VENV="${SUBAGENTD_CLIENT_VENV:-$WORK/venv}"
case "$(realpath -m "$VENV")" in
  "$REPO"/*) echo "python-client: $VENV is inside the repository" >&2; exit 1 ;;
esac
echo "==> python-client: a fresh venv at $VENV with the wheel and the test pins (no grpcio-tools)"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
grep -vE '^(grpcio-tools|setuptools)==' clients/python/requirements-ci.txt >"$WORK/requirements-run.txt"
# With the `tools` extra (subagentd.tools: the MCP SDK), held to the exact
# versions of requirements-mcp.txt, which mypy also needs to check it.
"$VENV/bin/pip" install "${PIP[@]}" "${WHEEL}[tools]" -r "$WORK/requirements-run.txt" \
  -r clients/python/requirements-mcp.txt -r clients/python/requirements-typing.txt
(cd "$WORK" && "$VENV/bin/python" - <<'EOF'
import importlib.util, subagentd, subagentd.tools, subagents.v1.subagents_pb2 as pb, sys
assert subagentd.__file__.startswith(sys.prefix), subagentd.__file__
assert subagentd.tools.__file__.startswith(sys.prefix), subagentd.tools.__file__
assert importlib.util.find_spec("grpc_tools") is None, "grpcio-tools is installed"
print("installed:", subagentd.__file__)
EOF
)

echo "==> python-client: mypy --strict on the installed package and the examples"
(cd "$WORK" && "$VENV/bin/mypy" --config-file "$REPO/clients/python/pyproject.toml" --strict -p subagentd \
  && "$VENV/bin/mypy" --config-file "$REPO/clients/python/pyproject.toml" --strict "$REPO/clients/python/examples")

echo "==> python-client: the tests, from outside the repository, against the installed wheel"
# A copy of tests/ and examples/ under $WORK: their paths lead nowhere near
# the source tree (the TypeScript-driven cases skip there: .ci/clients-e2e.sh
# runs them). The error-table test reads the server's reasons from the repo.
mkdir -p "$WORK/tree/clients/python"
cp -r clients/python/tests clients/python/examples "$WORK/tree/clients/python/"
find "$WORK/tree" -name __pycache__ -prune -exec rm -rf {} +
(cd "$WORK" && SUBAGENTD_REPO="$REPO" SUBAGENTD_BIN="$REPO/target/debug/subagentd" SUBAGENTD_REQUIRE_MCP=1 \
  "$VENV/bin/python" -W error::ResourceWarning -m unittest discover -s "$WORK/tree/clients/python/tests" -v)
