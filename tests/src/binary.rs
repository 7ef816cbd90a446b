//! Locating the `turnstile` binary.
//!
//! `TURNSTILE_BIN` wins when set (CI artefacts, a binary built elsewhere). Otherwise the harness runs
//! `cargo build -p turnstile --bin turnstile` once per test process, so `cargo nextest run` is
//! self-contained and never tests a stale binary; cargo's own build lock serializes the parallel test
//! processes, and after the first one the build is a no-op.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::HarnessError;

/// The workspace root, from this crate's manifest dir (`<root>/tests`).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map_or_else(|| manifest.to_path_buf(), Path::to_path_buf)
}

/// Cargo's target dir: `CARGO_TARGET_DIR` (relative to the workspace root) or `<root>/target`.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() { dir } else { workspace_root().join(dir) }
        }
        _ => workspace_root().join("target"),
    }
}

static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();

/// The path of a current `turnstile` binary, building it on first use in this process.
///
/// Blocking (it may run cargo); call it through `spawn_blocking` from async code.
pub fn turnstile_bin() -> Result<PathBuf, HarnessError> {
    BIN.get_or_init(locate).clone().map_err(HarnessError::Build)
}

fn locate() -> Result<PathBuf, String> {
    if let Some(bin) = std::env::var_os("TURNSTILE_BIN").filter(|b| !b.is_empty()) {
        let bin = PathBuf::from(bin);
        return if bin.is_file() { Ok(bin) } else { Err(format!("TURNSTILE_BIN={} is not a file", bin.display())) };
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(&cargo);
    command.args(["build", "-p", "turnstile", "--bin", "turnstile"]).current_dir(workspace_root());
    // The variables cargo set for this test process (CARGO_MANIFEST_DIR, CARGO_PKG_NAME, OUT_DIR, …) are
    // ones build scripts such as ring's rerun on: inherited, they would make this build differ from a
    // `cargo build` in a shell, and each would rebuild every crate above ring after the other.
    for (name, _) in std::env::vars_os() {
        if is_per_crate_variable(&name.to_string_lossy()) {
            command.env_remove(&name);
        }
    }
    let output = command.output().map_err(|e| format!("could not run {cargo:?}: {e}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!("cargo build -p turnstile exited with {}:\n{}", output.status, tail(&stderr, 60)));
    }
    let bin = target_dir().join("debug").join(format!("turnstile{}", std::env::consts::EXE_SUFFIX));
    if bin.is_file() { Ok(bin) } else { Err(format!("cargo built turnstile but {} does not exist", bin.display())) }
}

/// A variable cargo sets for the crate it compiles or runs, not one the user set.
fn is_per_crate_variable(name: &str) -> bool {
    const PREFIXES: [&str; 5] = ["CARGO_PKG_", "CARGO_MANIFEST_", "CARGO_BIN_", "CARGO_CFG_", "CARGO_FEATURE_"];
    const NAMES: [&str; 4] = ["CARGO_CRATE_NAME", "CARGO_PRIMARY_PACKAGE", "CARGO_TARGET_TMPDIR", "OUT_DIR"];
    PREFIXES.iter().any(|p| name.starts_with(p)) || NAMES.contains(&name)
}

/// The last `lines` lines of `text`.
pub(crate) fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// What one run of the `turnstile` CLI printed.
#[derive(Clone, Debug)]
pub struct CliOutput {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the `turnstile` CLI with `args` (colour off) to its end. Panics when the binary cannot be had or
/// run: a test of the CLI cannot go on without it.
pub async fn run_cli(args: Vec<String>) -> CliOutput {
    let out = tokio::task::spawn_blocking(move || {
        let bin = turnstile_bin().unwrap_or_else(|e| panic!("{e}"));
        Command::new(&bin).args(&args).env("NO_COLOR", "1").output()
    })
    .await
    .unwrap_or_else(|e| panic!("the CLI task failed: {e}"))
    .unwrap_or_else(|e| panic!("cannot run the turnstile CLI: {e}"));
    CliOutput {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}
