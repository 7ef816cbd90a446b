//! [`Running`]: the part every role's handle shares: a stop request and the task that serves until it.

use std::future::Future;

use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::NodeError;

/// A started role's serving task. Stopping is graceful: the task drains (in-flight calls, Watch streams,
/// a worker's sessions and leases) and then ends. Dropping it asks the task to stop without waiting.
#[derive(Debug)]
pub(crate) struct Running {
    stop: CancellationToken,
    task: JoinHandle<Result<(), NodeError>>,
    _stop_on_drop: DropGuard,
}

impl Running {
    /// Spawns `serve`, which must end soon after `stop` is cancelled.
    pub(crate) fn spawn<F>(stop: CancellationToken, serve: F) -> Self
    where
        F: Future<Output = Result<(), NodeError>> + Send + 'static,
    {
        let task = tokio::spawn(serve);
        Self { _stop_on_drop: stop.clone().drop_guard(), stop, task }
    }

    pub(crate) fn stop(&self) {
        self.stop.cancel();
    }

    pub(crate) async fn wait(self) -> Result<(), NodeError> {
        self.task.await.map_err(NodeError::Panicked)?
    }

    pub(crate) async fn run_until(mut self, signal: impl Future<Output = ()>) -> Result<(), NodeError> {
        tokio::select! {
            () = signal => self.stop.cancel(),
            done = &mut self.task => return done.map_err(NodeError::Panicked)?,
        }
        self.wait().await
    }
}

/// The methods every role's handle has, over its [`Running`].
macro_rules! handle_methods {
    () => {
        /// Asks the role to stop gracefully and returns at once; [`Self::wait`] then returns when it has.
        pub fn stop(&self) {
            self.running.stop();
        }

        /// Waits until the role has stopped (after [`Self::stop`], or by itself with an error).
        pub async fn wait(self) -> Result<(), $crate::NodeError> {
            self.running.wait().await
        }

        /// Stops the role gracefully and waits until it has.
        pub async fn shutdown(self) -> Result<(), $crate::NodeError> {
            self.running.stop();
            self.running.wait().await
        }

        /// Serves until `signal` resolves (e.g. [`crate::signal::shutdown_signal`]), then stops gracefully;
        /// returns early if the role stops by itself.
        pub async fn run_until(self, signal: impl std::future::Future<Output = ()>) -> Result<(), $crate::NodeError> {
            self.running.run_until(signal).await
        }
    };
}
pub(crate) use handle_methods;
