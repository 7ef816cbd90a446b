//! `/readyz` follows NATS (decision 0076): a gateway, a worker and `turnstile dev --nats` whose NATS server
//! hangs (SIGSTOP: the connection still looks open) or is killed (every address of `--nats` dead) answer
//! 503 naming NATS, and 200 again once it answers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use turnstile_tests::nats::http_get;
use turnstile_tests::{Cluster, DEFAULT_WAIT, DevOptions, DevServer};

/// Waits (bounded) until every endpoint's `/readyz` answers `code`; the last answers otherwise.
async fn wait_readyz(endpoints: &[(&str, SocketAddr)], code: u16) -> Vec<(String, u16, String)> {
    let mut last = Vec::new();
    let reached = tokio::time::timeout(DEFAULT_WAIT, async {
        loop {
            last.clear();
            for (name, addr) in endpoints {
                let (got, body) = http_get(*addr, "/readyz").await.unwrap_or((0, "no answer".into()));
                last.push(((*name).to_owned(), got, body));
            }
            if last.iter().all(|(_, got, _)| *got == code) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(reached.is_ok(), "not every /readyz answered {code} within {DEFAULT_WAIT:?}: {last:?}");
    last
}

fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill").args([signal, &pid.to_string()]).status().unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

mod cluster {
    use super::*;

    #[tokio::test]
    async fn servers_are_not_ready_while_nats_hangs_or_is_dead_and_ready_again_after() {
        let mut cluster = Cluster::start(1, 1).await.unwrap();
        let dev = DevServer::start_with(DevOptions::nats(cluster.nats_url())).await.unwrap();
        let endpoints = [
            ("gateway", cluster.gateway_http(0).unwrap()),
            ("worker", cluster.worker_http(0).unwrap()),
            ("dev", dev.http_addr().unwrap()),
        ];
        wait_readyz(&endpoints, 200).await;

        // Hung: the TCP connections stay open, only the answers stop.
        let pid = cluster.nats().pid().unwrap();
        signal(pid, "-STOP");
        let down = wait_readyz(&endpoints, 503).await;
        signal(pid, "-CONT");
        assert!(down.iter().all(|(_, _, body)| body.contains("NATS at")), "{down:?}");
        wait_readyz(&endpoints, 200).await;

        // Dead: every address of --nats refuses connections.
        cluster.kill9_nats(0);
        let down = wait_readyz(&endpoints, 503).await;
        assert!(down.iter().all(|(_, _, body)| body.contains("NATS at")), "{down:?}");
        cluster.restart_nats(0).await.unwrap();
        wait_readyz(&endpoints, 200).await;
    }
}

/// `/readyz` of a worker gates on its share of the shards (decision 0160): a worker that joins a cluster
/// whose other worker holds every shard answers 503 `joining` while it holds none, and 200 once it holds
/// its share. The other worker is paused (SIGSTOP) with leases that outlive the check (60 s TTL), so the new
/// worker cannot take a shard while it is looked at; resumed, it hands half over.
mod share {
    use super::*;
    use turnstile_tests::ClusterOptions;

    #[tokio::test]
    async fn a_joining_worker_is_not_ready_until_it_holds_its_share() {
        let mut opts = ClusterOptions::new(2, 1);
        opts.worker_args = ["--lease-ttl-ms", "60000"].map(str::to_owned).to_vec();
        const SHARDS: u64 = 256; // the default
        let mut cluster = Cluster::start_with(opts).await.unwrap();
        // Worker 1 leaves (its drain hands its shards back); worker 0 takes them all.
        cluster.sigterm_worker(1, Duration::from_secs(20)).await;
        let all = tokio::time::timeout(DEFAULT_WAIT, async {
            while cluster.shards_owned_by(0).await != Some(SHARDS) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        assert!(all.await.is_ok(), "worker 0 did not take every shard\n{}", cluster.logs());

        // Worker 0 paused holding every shard: worker 1 starts again and can take none.
        cluster.sigstop_worker(0);
        cluster.restart_worker(1).await.unwrap();
        let http = cluster.worker_http(1).unwrap();
        let joining = wait_readyz(&[("worker 1", http)], 503).await;
        assert!(joining[0].2.contains("not ready: joining: "), "{joining:?}");
        // Once its lease loop has counted the workers, it says what it holds against its share.
        let counted = tokio::time::timeout(DEFAULT_WAIT, async {
            loop {
                let (code, body) = http_get(http, "/readyz").await.unwrap();
                if body.contains("has not counted") {
                    assert_eq!(code, 503);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                return (code, body);
            }
        });
        let (code, body) = counted.await.expect("the lease loop never counted the workers");
        assert_eq!(code, 503, "{body}");
        assert!(body.starts_with("not ready: joining: holds 0 of its "), "{body}");
        assert_eq!(cluster.shards_owned_by(1).await.unwrap_or(0), 0);

        // Resumed, worker 0 hands half over; worker 1 is ready once it holds them.
        cluster.sigcont_worker(0);
        wait_readyz(&[("worker 1", http)], 200).await;
        // The gauge is set at the end of the lease round that took them: read it until it shows them.
        let share = tokio::time::timeout(DEFAULT_WAIT, async {
            while cluster.shards_owned_by(1).await.is_none_or(|n| n < SHARDS / 2) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        assert!(share.await.is_ok(), "ready, but its gauge never showed half the shards\n{}", cluster.logs());
    }
}
