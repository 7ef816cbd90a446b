//! The `SessionLog` contract suite, instantiated once per backend.

// Tests may panic on a broken expectation; that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[macro_use]
mod contract;

use std::sync::Arc;

use contract::Backend;
use turnstile_journal::EmbeddedLog;

async fn in_memory() -> Backend {
    Backend { log: Arc::new(EmbeddedLog::in_memory()), _keep: Box::new(()) }
}

async fn on_disk() -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let log = EmbeddedLog::open(dir.path()).unwrap();
    Backend { log: Arc::new(log), _keep: Box::new(dir) }
}

mod embedded_in_memory {
    contract_suite!(super::in_memory);
}

mod embedded_on_disk {
    contract_suite!(super::on_disk);
}
