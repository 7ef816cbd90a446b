//! A real headless browser: Debian's `chromium` (`CHROMIUM_BIN`, installed by `scripts/setup-test-deps`)
//! with a fresh profile, its DevTools endpoint on a loopback port it picked itself
//! (`--remote-debugging-port=0`, read back from the profile's `DevToolsActivePort`), and [`run_script`]
//! to drive it with a node script from `console/test/` (playwright-core over CDP, pinned in
//! `console/package-lock.json`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use tempfile::TempDir;

use crate::HarnessError;
use crate::process::ChildProcess;

const INSTALL_HINT: &str = "run scripts/setup-test-deps (it installs chromium and console/node_modules) and \
                            `source .ci/test-env.sh` (it sets CHROMIUM_BIN)";

/// A running headless chromium. Dropping it kills the browser and removes its profile.
#[derive(Debug)]
pub struct Chromium {
    process: ChildProcess,
    ws_endpoint: String,
    // Declared after `process`, so the profile outlives the browser.
    _profile: TempDir,
}

impl Chromium {
    /// Starts `$CHROMIUM_BIN` headless on `about:blank` and waits (≤ 30 s) for its DevTools endpoint.
    /// Panics with the install hint when `CHROMIUM_BIN` is unset (no fallbacks).
    pub async fn start() -> Result<Self, HarnessError> {
        let Some(bin) = std::env::var_os("CHROMIUM_BIN").filter(|v| !v.is_empty()) else {
            panic!("CHROMIUM_BIN is not set; {INSTALL_HINT}");
        };
        let profile = tempfile::Builder::new()
            .prefix("turnstile-chromium-")
            .tempdir()
            .map_err(|e| HarnessError::io("creating a chromium profile dir", e))?;
        let mut command = Command::new(bin);
        // As root chromium needs --no-sandbox; the rest keep it from calling home or updating itself, so
        // nothing leaves loopback.
        command
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-default-apps",
                "--disable-extensions",
                "--disable-dev-shm-usage",
                "--hide-scrollbars",
                "--mute-audio",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank");
        let log = profile.path().join("chromium.log");
        let mut process = ChildProcess::spawn("chromium", command, &log)?;
        let port_file = profile.path().join("DevToolsActivePort");
        let ws_endpoint = process
            .wait_for("its DevToolsActivePort file", crate::DEFAULT_WAIT, |_| read_devtools_port(&port_file))
            .await?;
        Ok(Self { process, ws_endpoint, _profile: profile })
    }

    /// `ws://127.0.0.1:PORT/devtools/browser/ID`, for `chromium.connectOverCDP`.
    pub fn ws_endpoint(&self) -> &str {
        &self.ws_endpoint
    }

    pub fn log_tail(&self) -> String {
        self.process.log_tail()
    }
}

/// The browser's endpoint from `DevToolsActivePort` (first line the port, second the path), once both
/// lines are written.
fn read_devtools_port(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut lines = text.lines();
    let port: u16 = lines.next()?.trim().parse().ok()?;
    let path = lines.next()?.trim();
    path.starts_with("/devtools/browser/").then(|| format!("ws://127.0.0.1:{port}{path}"))
}

/// `console/` of this checkout.
pub fn console_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("console")
}

/// Runs `node console/test/SCRIPT` with `env` and waits for it (bounded by `timeout`; the script bounds
/// its own waits). Panics with the install hint when `console/node_modules` is missing.
pub async fn run_script(script: &str, env: Vec<(String, String)>, timeout: Duration) -> Result<Output, HarnessError> {
    let dir = console_dir();
    if !dir.join("node_modules").join("playwright-core").is_dir() {
        panic!("{} has no node_modules/playwright-core; {INSTALL_HINT}", dir.display());
    }
    let mut command = tokio::process::Command::new("node");
    command.arg(dir.join("test").join(script)).current_dir(&dir).envs(env).kill_on_drop(true);
    match tokio::time::timeout(timeout, command.output()).await {
        Ok(out) => out.map_err(|e| HarnessError::io(format!("running node {script}"), e)),
        Err(_) => Err(HarnessError::WaitTimeout {
            what: format!("node {script} to finish"),
            waited: timeout,
            recorded: String::new(),
        }),
    }
}
