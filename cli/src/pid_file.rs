//! `--pid-file FILE` of the servers: this process's id, for `kill -HUP "$(cat FILE)"` (reload the auth
//! file) on a host that runs several Turnstile processes, where `pidof turnstile` names them all.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

/// The written pid file; dropping it (the server stopped) removes the file if it still names this process.
#[derive(Debug)]
pub(crate) struct PidFile {
    path: PathBuf,
    pid: String,
}

impl PidFile {
    /// Writes `path` (beside it first, then renamed over it: a reader sees the whole id or the old file).
    pub(crate) fn write(path: &Path) -> Result<Self> {
        let pid = std::process::id().to_string();
        let name = path.file_name().with_context(|| format!("--pid-file {} names no file", path.display()))?;
        let temporary = path.with_file_name(format!(".{}.{pid}.tmp", name.to_string_lossy()));
        std::fs::write(&temporary, format!("{pid}\n"))
            .and_then(|()| std::fs::rename(&temporary, path))
            .with_context(|| format!("cannot write --pid-file {}", path.display()))?;
        Ok(Self { path: path.to_path_buf(), pid })
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        // Another process may have taken the path over since (a second server given the same file).
        if std::fs::read_to_string(&self.path).is_ok_and(|s| s.trim() == self.pid) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_file_holds_the_pid_while_the_guard_lives_and_only_ours_is_removed() {
        let dir = std::env::temp_dir().join(format!("turnstile-pid-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("gateway.pid");
        let guard = PidFile::write(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), format!("{}\n", std::process::id()));
        drop(guard);
        assert!(!path.exists());
        // A file some other process wrote over ours stays.
        let guard = PidFile::write(&path).unwrap();
        std::fs::write(&path, "1\n").unwrap();
        drop(guard);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "1\n");
        assert!(PidFile::write(Path::new("/")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
