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
