//! A phase run in a child process of this binary: a phase that starts its own servers (the failover and
//! cluster phases' harnesses) runs the binary under test there, apart from the parent's measurements.

use anyhow::{Context as _, Result};

/// Runs `turnstile-bench <mode> … --json` (this executable) with `TURNSTILE_BIN` = `bin`, so the phase's
/// own servers (the failover cluster's harness included) run the binary under test; its JSON object.
pub(crate) async fn child_phase(bin: &std::path::Path, mode_args: &[&str]) -> Result<serde_json::Value> {
    let me = std::env::current_exe().context("locating turnstile-bench")?;
    let mut command = std::process::Command::new(&me);
    command.args(mode_args).arg("--json").env("TURNSTILE_BIN", bin).stderr(std::process::Stdio::inherit());
    if std::env::var_os("RUST_LOG").is_none() {
        // The harness's processes log at info unless told: a measured cluster must not measure its logger.
        command.env("RUST_LOG", "warn");
    }
    let output = tokio::task::spawn_blocking(move || command.output())
        .await?
        .with_context(|| format!("running {} {}", me.display(), mode_args.join(" ")))?;
    if !output.status.success() {
        anyhow::bail!("`turnstile-bench {}` failed ({})", mode_args.join(" "), output.status);
    }
    serde_json::from_slice(&output.stdout).with_context(|| format!("the JSON of `turnstile-bench {}`", mode_args[0]))
}
