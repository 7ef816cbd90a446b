//! Files read again while a role runs (decisions 0035 and 0159): the auth file (`--auth-tokens`,
//! `--jwt-key`), the listener's TLS (`--tls-cert/--tls-key/--tls-client-ca`) and the TLS to the workers
//! (`--cluster-tls-*`). Each is read again on SIGHUP and when its bytes change (a poll every
//! [`POLL`]); what was reloaded, or why new files were refused and the old material kept, is logged
//! and counted in `turnstile_reloads_total{what, outcome}`.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use turnstile_cluster::GrpcTransport;
use turnstile_gateway::auth::{Authenticator, Reloadable};
use turnstile_ops::names;
use turnstile_ops::tls::{LiveClientTls, LiveServerTls};

use crate::NodeError;

/// How often the files' bytes are compared with the last ones read: a rotated key, a revoked token or a
/// renewed certificate is in force within this long even without a SIGHUP. Reading a few small files every
/// few seconds costs nothing and, unlike a modification time, also sees a rewrite within the same second
/// and a Kubernetes Secret's symlink swap.
const POLL: Duration = Duration::from_secs(2);

/// The TLS to the workers: its files, and the transport that dials with it.
pub(crate) struct ClusterTlsWatch {
    pub(crate) files: LiveClientTls,
    pub(crate) transport: Arc<GrpcTransport>,
}

/// The files of a role that can be read again, and the SIGHUP that forces it ([`Reloads::spawn`]).
pub(crate) struct Reloads {
    auth: Option<Arc<Reloadable>>,
    tls: Option<Arc<LiveServerTls>>,
    cluster_tls: Option<ClusterTlsWatch>,
    #[cfg(unix)]
    hangup: tokio::signal::unix::Signal,
}

impl Reloads {
    /// Installs the SIGHUP handler now, so a SIGHUP sent once the server reports ready reloads instead of
    /// killing it (the default action). `None` when there is nothing to reload (auth off, no TLS): SIGHUP
    /// then keeps its default action.
    pub(crate) fn install(
        auth: &Authenticator,
        tls: Option<&Arc<LiveServerTls>>,
        cluster_tls: Option<ClusterTlsWatch>,
    ) -> Result<Option<Self>, NodeError> {
        let auth = match auth {
            Authenticator::Reloadable(live) => Some(Arc::clone(live)),
            _ => None,
        };
        if auth.is_none() && tls.is_none() && cluster_tls.is_none() {
            return Ok(None);
        }
        Ok(Some(Self {
            auth,
            tls: tls.cloned(),
            cluster_tls,
            #[cfg(unix)]
            hangup: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
                .map_err(|cause| NodeError::Signal { signal: "SIGHUP", cause })?,
        }))
    }

    /// Watches until `stop`.
    pub(crate) fn spawn(self, stop: CancellationToken) {
        #[cfg(unix)]
        let Self { auth, tls, cluster_tls, mut hangup } = self;
        #[cfg(not(unix))]
        let Self { auth, tls, cluster_tls } = self;
        let cluster_tls = cluster_tls.map(Arc::new);
        tokio::spawn(async move {
            let mut poll = tokio::time::interval(POLL);
            poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                #[cfg(unix)]
                let hup = hangup.recv();
                #[cfg(not(unix))]
                let hup = std::future::pending::<Option<()>>();
                let force = tokio::select! {
                    () = stop.cancelled() => return,
                    _ = hup => true,
                    _ = poll.tick() => false,
                };
                if let Some(live) = &auth {
                    reload_auth(live, force).await;
                }
                if let Some(live) = &tls {
                    let live = Arc::clone(live);
                    let path = live.files().cert.display().to_string();
                    let reloaded = tokio::task::spawn_blocking(move || live.reload(force)).await;
                    report("tls", &path, force, reloaded.ok().flatten());
                }
                if let Some(watch) = &cluster_tls {
                    let watch = Arc::clone(watch);
                    let path = watch.files.files().identity.as_ref().map_or(&watch.files.files().ca, |(c, _)| c);
                    let path = path.display().to_string();
                    let reloaded = tokio::task::spawn_blocking(move || {
                        watch.files.reload(force).map(|r| {
                            r.map(|(config, reloaded)| {
                                watch.transport.set_tls(config);
                                reloaded
                            })
                        })
                    })
                    .await;
                    report("cluster_tls", &path, force, reloaded.ok().flatten());
                }
            }
        });
    }
}

async fn reload_auth(live: &Reloadable, force: bool) {
    let path = live.source().path().display().to_string();
    match live.reload(force).await {
        None => {}
        Some(Ok(summary)) => {
            counted("auth", "ok");
            tracing::info!(file = %path, sighup = force, "auth reloaded: {summary}");
        }
        Some(Err(e)) => {
            counted("auth", "error");
            tracing::error!(
                file = %path,
                sighup = force,
                "auth reload failed, the previous tokens and keys stay in force: {e}"
            );
        }
    }
}

/// Logs and counts a TLS reload (`None`: the files did not change).
fn report<T: std::fmt::Display, E: std::fmt::Display>(
    what: &'static str,
    path: &str,
    force: bool,
    reloaded: Option<Result<T, E>>,
) {
    match reloaded {
        None => {}
        Some(Ok(reloaded)) => {
            counted(what, "ok");
            tracing::info!(file = %path, sighup = force, "{what} reloaded: {reloaded}");
        }
        Some(Err(e)) => {
            counted(what, "error");
            tracing::error!(
                file = %path,
                sighup = force,
                "{what} reload failed, the previous certificate stays in force: {e}"
            );
        }
    }
}

fn counted(what: &'static str, outcome: &'static str) {
    metrics::counter!(names::RELOADS, "what" => what, "outcome" => outcome).increment(1);
}
