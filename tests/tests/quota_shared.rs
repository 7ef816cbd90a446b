//! Watch slots counted across gateways in the NATS KV bucket `turnstile_quotas` with no lock held over its
//! round trips (decision 0089): a slot is reserved in the gateway's own count, then written by
//! compare-and-set with every reservation of the moment. Two gateways' `Quotas` on one real nats-server
//! (the harness's), in process: a burst of opens on both never passes the limit, another tenant's opens
//! are counted apart, and once the streams end their slots are free again, exactly the limit of them.

// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use tonic::Code;
use turnstile_gateway::quota::WatchPermit;
use turnstile_gateway::{QuotaConfig, Quotas};
use turnstile_tests::nats::NatsServer;

const LIMIT: usize = 5;

/// Generous bound on waiting for something that should happen.
const PATIENCE: Duration = Duration::from_secs(30);

/// `n` opens of `tenant` at once, alternating between the gateways: the admitted permits.
async fn burst(gateways: &[Quotas; 2], tenant: &str, n: usize) -> Vec<WatchPermit> {
    let opens = (0..n).map(|i| {
        let quotas = gateways[i % 2].clone();
        let tenant = tenant.to_owned();
        async move { quotas.open_watch(&tenant).await }
    });
    let mut admitted = Vec::new();
    for result in futures::future::join_all(opens).await {
        match result {
            Ok(permit) => admitted.push(permit),
            Err(status) => assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}"),
        }
    }
    admitted
}

#[tokio::test]
async fn concurrent_watch_opens_on_two_gateways_never_pass_the_limit() {
    let nats = NatsServer::start().await.unwrap();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let config = QuotaConfig { max_watches: LIMIT, ..QuotaConfig::default() };
    let gateways =
        [Quotas::shared(config.clone(), &client, 1).await.unwrap(), Quotas::shared(config, &client, 1).await.unwrap()];

    let (t, u) = tokio::join!(burst(&gateways, "t", 40), burst(&gateways, "u", 40));
    assert!((1..=LIMIT).contains(&t.len()), "tenant t was admitted {} of {LIMIT}", t.len());
    assert!((1..=LIMIT).contains(&u.len()), "tenant u was admitted {} of {LIMIT}", u.len());
    drop((t, u));

    // The ended streams' counts are written in the background: once they are, exactly LIMIT opens one
    // after the other are admitted across both gateways, and the next is refused.
    let exact = tokio::time::timeout(PATIENCE, async {
        loop {
            let mut held = Vec::new();
            for i in 0..LIMIT {
                match gateways[i % 2].open_watch("t").await {
                    Ok(permit) => held.push(permit),
                    Err(_) => break,
                }
            }
            if held.len() == LIMIT {
                return held;
            }
            drop(held);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the ended streams' slots were freed");
    let refused = gateways[1].open_watch("t").await.expect_err("one over the limit");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(refused.message().contains("limits.tenant_max_watches"), "{refused:?}");
    drop(exact);
}
