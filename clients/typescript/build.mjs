// Builds the package into dist/ (ES modules and .d.ts), from the repository's protos and src/, with the
// tools package-lock.json pins (decision 0055): nothing is fetched, nothing generated is committed.
//
//   1. buf generate: turnstile.v1's messages and service descriptor (protoc-gen-es) into src/gen/
//   2. tsc: src/ into dist/
//   3. tsc --noEmit over the tests and examples (test/tsconfig.json: checkJs against dist/'s types)
//
// A stamp (.build-stamp, the digest of every input) makes a second run with nothing changed a no-op, so
// the tests can call it freely; they serialise concurrent runs with flock(1) (tests/tests/typescript_client.rs).

import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const protos = join(here, "..", "..", "proto", "proto", "turnstile", "v1");
const stampFile = join(here, ".build-stamp");
const bin = (name) => join(here, "node_modules", ".bin", name);

if (!existsSync(bin("buf")) || !existsSync(bin("tsc"))) {
  console.error("build.mjs: node_modules is missing: run `npm ci` in clients/typescript (scripts/setup-test-deps does)");
  process.exit(1);
}

function files(dir, skip = () => false) {
  return readdirSync(dir, { withFileTypes: true })
    .flatMap((e) => {
      const path = join(dir, e.name);
      if (skip(path)) return [];
      return e.isDirectory() ? files(path, skip) : [path];
    })
    .sort();
}

/** The digest of everything the output depends on. */
function stamp() {
  const hash = createHash("sha256");
  const inputs = [
    ...files(protos),
    ...files(join(here, "src"), (p) => p === join(here, "src", "gen")),
    ...files(join(here, "test")),
    ...["build.mjs", "buf.gen.yaml", "tsconfig.json", "package-lock.json"].map((f) => join(here, f)),
  ];
  for (const f of inputs) {
    hash.update(relative(here, f)).update("\0").update(readFileSync(f)).update("\0");
  }
  return hash.digest("hex");
}

/** Runs a tool of node_modules/.bin in the package; exits the build when it fails (its output is above). */
function tool(name, ...args) {
  const result = spawnSync(bin(name), args, { cwd: here, stdio: "inherit" });
  if (result.status !== 0) {
    console.error(`build.mjs: ${name} ${args.join(" ")} exited with ${result.status ?? result.signal}`);
    process.exit(1);
  }
}

const want = stamp();
const built = existsSync(join(here, "dist", "index.js")) && existsSync(stampFile) && readFileSync(stampFile, "utf8") === want;
if (built && !process.argv.includes("--force")) {
  console.log("clients/typescript: dist/ is up to date");
  process.exit(0);
}
rmSync(stampFile, { force: true });
const t0 = Date.now();
tool("buf", "generate");
rmSync(join(here, "dist"), { recursive: true, force: true });
tool("tsc", "-p", "tsconfig.json");
tool("tsc", "-p", join("test", "tsconfig.json"));
writeFileSync(stampFile, want);
const size = files(join(here, "dist")).reduce((n, f) => n + statSync(f).size, 0);
console.log(`clients/typescript: built dist/ (${size} bytes) in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
