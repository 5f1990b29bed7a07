// The package's entry points: "@subagentd/client" loads neither the MCP SDK
// nor `ai`; "@subagentd/client/tools" is where the MCP SDK comes in, and `ai`
// only by a dynamic import (an optional peer dependency).

import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { describe, it } from "node:test";

const SRC = path.join(path.dirname(fileURLToPath(import.meta.url)), "..", "src");

/** The packages a built module and the package's modules it imports import, statically and dynamically. */
function imports(entry: string): { static: Set<string>; dynamic: Set<string> } {
  const out = { static: new Set<string>(), dynamic: new Set<string>() };
  const seen = new Set<string>();
  const visit = (file: string): void => {
    if (seen.has(file)) {
      return;
    }
    seen.add(file);
    const code = fs.readFileSync(file, "utf8");
    for (const [, spec] of code.matchAll(/^\s*(?:import|export)\b[^;]*?\bfrom\s*["']([^"']+)["']|^\s*import\s*["']([^"']+)["']/gm)) {
      if (spec === undefined) {
        continue;
      }
      if (spec.startsWith(".")) {
        visit(path.resolve(path.dirname(file), spec));
      } else {
        out.static.add(spec);
      }
    }
    for (const [, spec] of code.matchAll(/\bimport\(\s*["']([^"']+)["']\s*\)/g)) {
      out.dynamic.add(spec!);
    }
  };
  visit(path.join(SRC, entry));
  return out;
}

const isMcp = (spec: string) => spec.startsWith("@modelcontextprotocol/");

describe("entry points", () => {
  it("the main entry loads neither the MCP SDK nor ai", () => {
    const main = imports("index.js");
    assert.ok(main.static.has("@connectrpc/connect"), [...main.static].join(", "));
    assert.deepEqual([...main.static].filter((s) => isMcp(s) || s === "ai"), []);
    assert.deepEqual([...main.dynamic], []);
  });

  it("the tools entry loads the MCP SDK, and ai only when asked", () => {
    const tools = imports("tools.js");
    assert.ok([...tools.static].some(isMcp), [...tools.static].join(", "));
    assert.equal(tools.static.has("ai"), false, "type imports of ai are erased");
    assert.deepEqual([...tools.dynamic], ["ai"]);
  });
});
