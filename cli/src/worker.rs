//! `turnstile worker`: one worker of a cluster. It heartbeats, takes its fair share of shard leases, runs
//! the drivers of those shards' sessions and serves them to gateways over the internal
//! `turnstile.cluster.v1.Worker` API. SIGTERM drains its sessions and releases its leases before it exits,
//! so the next owners start at once instead of waiting for the leases to expire.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tonic::transport::ServerTlsConfig;
use turnstile_journal::jetstream::NatsSecurity;
use turnstile_worker::WorkerConfig;
use turnstile_worker::cluster::service::{self, WorkerService};
use turnstile_worker::cluster::{LeaseConfig, WorkerOptions, start_worker};

use crate::dev::{bind, bound_with_http, membership_error, report_bound, shutdown_signal};

/// Options of `turnstile worker`.
#[derive(Clone, Debug)]
pub struct WorkerOpts {
    pub nats: String,
    pub listen: String,
    /// The address gateways dial (in the heartbeat and the shard leases); `None` is the bound address, so
    /// `--listen 127.0.0.1:0` advertises the port the kernel picked.
    pub advertise: Option<String>,
    /// `None`: `worker-<advertised address>`.
    pub id: Option<String>,
    pub partitions: u32,
    pub replicas: usize,
    pub shards: u32,
    pub lease_ttl: Duration,
    pub renew_every: Duration,
    pub drain_timeout: Duration,
    /// `--nats-creds`, `--nats-ca`, `--nats-tls-cert/--nats-tls-key`.
    pub nats_security: NatsSecurity,
    /// Serve the internal API over TLS (`--tls-cert/--tls-key`); gateways dial with `--cluster-tls-ca`.
    pub tls: Option<ServerTlsConfig>,
    /// `--http`: `/metrics`, `/healthz`, `/readyz`.
    pub http: Option<String>,
    /// `--ready-file`: where [`report_bound`] writes the bound addresses (and the advertised one).
    pub ready_file: Option<PathBuf>,
}

pub async fn run(opts: WorkerOpts) -> Result<()> {
    crate::ops::install_metrics();
    let started = std::time::Instant::now();
    let listener = bind(&opts.listen).await?;
    let local = listener.local_addr().context("cannot read the bound address")?;
    let advertise = opts.advertise.clone().unwrap_or_else(|| local.to_string());
    let id = opts.id.clone().unwrap_or_else(|| format!("worker-{advertise}"));

    let (log, bus, snapshots) = crate::dev::open_nats_journal(
        &opts.nats,
        opts.partitions,
        opts.replicas,
        opts.shards,
        opts.nats_security.clone(),
    )
    .await?;
    let client = log.client().clone();
    let leases = LeaseConfig {
        shards: opts.shards,
        ttl: opts.lease_ttl,
        renew_every: opts.renew_every,
        drain_timeout: opts.drain_timeout,
        ..LeaseConfig::default()
    };
    let options =
        WorkerOptions { id: id.clone(), advertise_addr: advertise.clone(), leases, worker: WorkerConfig::default() };
    let handle = start_worker(options, &client, opts.replicas, Arc::new(log), Arc::new(bus), Arc::new(snapshots))
        .await
        .map_err(|e| membership_error(&opts.nats, &e))?;

    // The server keeps answering while the worker drains (not-owner for released shards tells gateways
    // to look again), so it stops only after `shutdown`.
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut server =
        tokio::spawn(service::serve_with(WorkerService::new(handle.host()), listener, opts.tls.clone(), async {
            let _ = stop_rx.await;
        }));
    let grace = crate::ops::worker_grace(opts.renew_every, opts.lease_ttl, opts.drain_timeout);
    let ready = crate::ops::worker_ready(client.clone(), opts.nats.clone(), handle.leases(), started, grace);
    let http = crate::ops::OpsHttp::start(opts.http.as_deref(), Arc::new(ready)).await?;
    println!("turnstile worker {id} serving on {advertise}");
    println!("http: {}", http.describe());
    let bound = bound_with_http("worker", local, &http);
    if let Err(e) =
        report_bound(&bound, &[("id", id.clone()), ("advertise", advertise.clone())], opts.ready_file.as_deref())
    {
        // It holds leases by now: leave the cluster so the shards move on at once.
        handle.shutdown(opts.drain_timeout).await;
        return Err(e);
    }
    tracing::info!(%id, %local, %advertise, shards = opts.shards, "serving turnstile.cluster.v1.Worker");

    tokio::select! {
        () = shutdown_signal() => {}
        result = &mut server => {
            // The server ended by itself: leave the cluster anyway so the shards move on at once.
            handle.shutdown(opts.drain_timeout).await;
            return result.context("the server task panicked")?.context("the internal gRPC server stopped");
        }
    }
    tracing::info!(%id, drain_timeout_ms = opts.drain_timeout.as_millis() as u64, "draining and releasing shards");
    handle.shutdown(opts.drain_timeout).await;
    let _ = stop_tx.send(());
    server.await.context("the server task panicked")?.context("the internal gRPC server stopped")?;
    http.stop();
    tracing::info!(%id, "stopped");
    Ok(())
}
