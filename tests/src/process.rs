//! One spawned server process: its log file, liveness, and how it ends.
//!
//! stdout and stderr go to one log file (not pipes), so a chatty server never blocks on a full pipe and
//! the test runner sees no leaked handles. Dropping a [`ChildProcess`] SIGKILLs and reaps it, so a
//! panicking test never leaves a server behind.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::HarnessError;
use crate::binary::tail;

/// A running child with its output captured to `log_path`.
#[derive(Debug)]
pub struct ChildProcess {
    name: String,
    child: Option<Child>,
    log_path: PathBuf,
}

impl ChildProcess {
    /// Spawns `command` with stdin closed and stdout + stderr appended to `log_path`.
    pub fn spawn(name: impl Into<String>, mut command: Command, log_path: &Path) -> Result<Self, HarnessError> {
        let name = name.into();
        let log = File::options()
            .create(true)
            .append(true)
            .open(log_path)
            .map_err(|e| HarnessError::io(format!("opening {}", log_path.display()), e))?;
        let log_err = log.try_clone().map_err(|e| HarnessError::io("cloning the log handle", e))?;
        command.stdin(Stdio::null()).stdout(log).stderr(log_err);
        let child = command.spawn().map_err(|e| HarnessError::io(format!("spawning {name}"), e))?;
        Ok(Self { name, child: Some(child), log_path: log_path.to_path_buf() })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Renames it for later messages (e.g. with the address it reported).
    pub fn set_name(&mut self, name: impl Into<String>) {
        self.name = name.into();
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The process's resident set now (`VmRSS` of `/proc/PID/status`), in bytes; `None` once it is gone.
    pub fn rss_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        let kib = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().strip_suffix("kB")?.trim();
        kib.parse::<u64>().ok().map(|k| k * 1024)
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The last lines of the log (for failure messages).
    pub fn log_tail(&self) -> String {
        match std::fs::read(&self.log_path) {
            Ok(bytes) => tail(&String::from_utf8_lossy(&bytes), 40),
            Err(e) => format!("<could not read {}: {e}>", self.log_path.display()),
        }
    }

    /// `Some(status)` when the process has exited (it is then reaped).
    pub fn exited(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(e) => Some(format!("unknown ({e})")),
        }
    }

    /// An [`HarnessError::Exited`] describing the exit, if the process has exited.
    pub fn exited_error(&mut self) -> Option<HarnessError> {
        let status = self.exited()?;
        Some(HarnessError::Exited { what: self.name.clone(), status, log_tail: self.log_tail() })
    }

    /// Waits (bounded by `timeout`) until `probe`, given the process id, finds what the starting process
    /// reports ([`crate::ports`]: its bound addresses). Fails as soon as the process exits, and on timeout,
    /// with the log's tail; `what` names the awaited report in that message.
    pub async fn wait_for<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        mut probe: impl FnMut(u32) -> Option<T>,
    ) -> Result<T, HarnessError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(e) = self.exited_error() {
                return Err(e);
            }
            let Some(pid) = self.pid() else {
                return Err(HarnessError::Exited {
                    what: self.name.clone(),
                    status: "killed".into(),
                    log_tail: self.log_tail(),
                });
            };
            if let Some(found) = probe(pid) {
                return Ok(found);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(HarnessError::StartTimeout {
                    what: format!("{} ({what})", self.name),
                    waited: timeout,
                    log_tail: self.log_tail(),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILL and reap: the crash case. Idempotent.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // An error here means it already exited; either way we reap below.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends `signal` (a `kill -s` name such as `HUP`) and does not wait; nothing if it has exited.
    pub fn signal(&self, signal: &str) -> Result<(), HarnessError> {
        let Some(pid) = self.pid() else { return Ok(()) };
        // As in `stop`: `kill(1)` spares a libc dependency.
        let status = Command::new("kill")
            .args(["-s", signal, &pid.to_string()])
            .status()
            .map_err(|e| HarnessError::io("running kill", e))?;
        if status.success() {
            Ok(())
        } else {
            Err(HarnessError::io(
                "sending a signal",
                std::io::Error::other(format!("kill -s {signal} {pid}: {status}")),
            ))
        }
    }

    /// SIGTERM, wait up to `grace` for the exit, then SIGKILL. Idempotent.
    pub async fn stop(&mut self, grace: Duration) {
        let Some(pid) = self.pid() else { return };
        // std has no SIGTERM; `kill(1)` is everywhere the suite runs and spares a libc dependency.
        let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
        let deadline = tokio::time::Instant::now() + grace;
        while tokio::time::Instant::now() < deadline {
            if self.exited().is_some() {
                self.child = None;
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.kill();
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
