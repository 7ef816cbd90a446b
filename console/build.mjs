// Builds the console into dist/ (index.html, console.js, console.css), which the gateway embeds with
// include_bytes! (gateway/src/console.rs). dist/ is committed, so `cargo build` needs neither node nor the
// network; `node build.mjs --check` (run by .ci/run) rebuilds into a temporary directory and fails if the
// committed files differ. Every tool is pinned in package-lock.json; the same inputs give the same bytes.
//
//   1. the TypeScript client (../clients/typescript/build.mjs, a no-op when its dist/ is up to date): the
//      console calls the API through its browser entry, `@turnstile/client/browser` (tsconfig.json's
//      `paths` maps it to ../clients/typescript/dist/browser: its .d.ts for tsc, its .js for esbuild)
//   2. tsc --noEmit: type-check src/
//   3. esbuild: one minified ES2022 bundle, no source map, no banner with dates or paths

import { execFileSync } from "node:child_process";
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import * as esbuild from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));
const check = process.argv.includes("--check");
const bin = (name) => join(here, "node_modules", ".bin", name);
const run = (cmd, args) => {
  try {
    execFileSync(cmd, args, { cwd: here, stdio: "inherit" });
  } catch {
    console.error(`build.mjs: ${cmd.split("/").pop()} ${args.join(" ")} failed (its output is above)`);
    process.exit(1);
  }
};

run(process.execPath, [join(here, "..", "clients", "typescript", "build.mjs")]);
run(bin("tsc"), ["--noEmit", "-p", "tsconfig.json"]);

const out = check ? mkdtempSync(join(tmpdir(), "turnstile-console-")) : join(here, "dist");
mkdirSync(out, { recursive: true });
await esbuild.build({
  entryPoints: [join(here, "src", "main.ts")],
  outfile: join(out, "console.js"),
  bundle: true,
  minify: true,
  format: "iife",
  target: "es2022",
  legalComments: "none",
  charset: "utf8",
  logLevel: "warning",
});
copyFileSync(join(here, "src", "index.html"), join(out, "index.html"));
copyFileSync(join(here, "src", "console.css"), join(out, "console.css"));

if (check) {
  const committed = join(here, "dist");
  const stale = readdirSync(out).filter((f) => {
    try {
      return !readFileSync(join(out, f)).equals(readFileSync(join(committed, f)));
    } catch {
      return true;
    }
  });
  rmSync(out, { recursive: true, force: true });
  if (stale.length > 0) {
    console.error(`console/dist is out of date (${stale.join(", ")}): run \`npm --prefix console run build\` and commit console/dist`);
    process.exit(1);
  }
  console.log("console/dist is up to date");
} else {
  for (const f of readdirSync(out)) console.log(`console/dist/${f}  ${readFileSync(join(out, f)).length} bytes`);
}
