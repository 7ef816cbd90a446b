//! Configuration files for the processes a test starts (`--config FILE`).

use std::path::{Path, PathBuf};

use tempfile::TempDir;

/// `text` written to `turnstile.toml` in a fresh directory, which lives as long as the returned `TempDir`.
///
/// # Panics
/// When the temporary directory or the file cannot be written (a broken test machine).
#[allow(clippy::expect_used)] // Test harness: a machine that cannot write a temp file fails the test.
pub fn config_file(text: &str) -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("turnstile.toml");
    std::fs::write(&path, text).expect("the configuration file written");
    (dir, path)
}

/// `--config PATH`, for `DevOptions::extra_args` or a cluster's worker and gateway arguments.
pub fn config_args(path: &Path) -> Vec<String> {
    vec!["--config".to_owned(), path.to_string_lossy().into_owned()]
}
