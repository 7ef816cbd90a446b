//! SPEC §17 across real processes: the usage a cluster counts per tenant equals the sum of the durable
//! `assistant/message` usages even when the owner is killed mid-turn (decision 0063); a tenant over its daily
//! token budget gets the typed turn end; and the per-tenant request rate and Watch limit hold across two
//! gateways together (decision 0065), not per gateway.
// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tonic::Code;
use turnstile_proto::v1::session_event::Payload;
use turnstile_proto::v1::turn_end_reason::Reason;
use turnstile_proto::v1::{GetUsageRequest, SessionEvent, SessionRef, TenantUsage, WatchRequest};
use turnstile_tests::{Cluster, ClusterOptions, DevServer, Session, user_msg};

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|a| (*a).to_owned()).collect()
}

/// A configuration file for every process of the cluster.
fn config_file(text: &str) -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("turnstile.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

fn session(cluster: &Cluster, g: usize, tenant: &str, id: &str) -> Session {
    Session::with_ref(cluster.client(g), SessionRef { tenant: tenant.into(), id: id.into() })
}

/// Input plus output tokens of every `assistant/message` in `events`.
fn recorded(events: &[SessionEvent]) -> (u64, u64) {
    events
        .iter()
        .filter_map(|e| match &e.payload {
            Some(Payload::AssistantMessage(a)) => a.usage,
            _ => None,
        })
        .fold((0, 0), |(i, o), u| (i + u.input_tokens, o + u.output_tokens))
}

async fn usage(cluster: &Cluster, g: usize, tenant: &str) -> TenantUsage {
    let request = GetUsageRequest { tenant: tenant.into(), since_unix_ms: 0 };
    cluster.client(g).get_usage(request).await.unwrap().into_inner()
}

fn totals(u: &TenantUsage) -> (u64, u64) {
    u.models.iter().fold((0, 0), |(i, o), m| (i + m.input_tokens, o + m.output_tokens))
}

/// Waits (up to 15 s) until the tenant's counted usage is `want`; the last answer either way.
async fn counted(cluster: &Cluster, tenant: &str, want: (u64, u64)) -> TenantUsage {
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        let u = usage(cluster, 0, tenant).await;
        if totals(&u) == want || Instant::now() > until {
            return u;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn after_a_kill_9_of_the_owner_mid_turn_the_counted_usage_equals_the_durable_messages() {
    let mut opts = ClusterOptions::new(2, 1);
    opts.worker_args = args(&["--shards", "16", "--lease-ttl-ms", "1500"]);
    opts.gateway_args = args(&["--shards", "16", "--route-deadline-ms", "5000"]);
    let mut cluster = Cluster::start_with(opts).await.unwrap();
    cluster.wait_balanced().await.unwrap();

    // Sessions on both workers finish turns that report usage.
    let mut sessions = Vec::new();
    for i in 0..4 {
        let s = session(&cluster, 0, "metered", &format!("s{i}"));
        s.followup(user_msg(&format!("a{i}"), "[[usage:100,7]] hello")).await.unwrap();
        s.when_idle().await.unwrap();
        sessions.push(s);
    }
    // One turn's first step is durable (its usage and a tool call) when its owner is killed.
    let victim = &sessions[0];
    let watch = victim.watch().await.unwrap();
    victim.followup(user_msg("k", "[[usage:40,4]] [[tool:sleep 3000]] go")).await.unwrap();
    watch.wait_line("D tool/call 2.1 sleep *").await.unwrap();
    let owner = victim.info().await.unwrap().owner;
    cluster.kill9_worker(cluster.worker_index(&owner).unwrap());
    // The new owner ends the turn interrupted and answers the interrupted call's result (SPEC §6).
    watch.wait_line("D turn/end 2 interrupted").await.unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        match victim.when_idle().await {
            Ok(info) if info.status == turnstile_proto::v1::SessionStatus::Idle as i32 => break,
            Ok(_) => {}
            Err(status) if status.code() == Code::Unavailable || status.code() == Code::DeadlineExceeded => {}
            Err(status) => panic!("{status:?}"),
        }
        assert!(Instant::now() < until, "the session never went idle after the kill");
    }

    let mut want = (0, 0);
    for s in &sessions {
        let (events, _) = s.replay(0).await.unwrap();
        let (i, o) = recorded(&events);
        want = (want.0 + i, want.1 + o);
    }
    // 4 × 100/7, then 40/4 before the kill; the resumed step answers the result, not the prompt (whose
    // `[[usage]]` would count again), decision 0143.
    assert_eq!(want, (440, 32));
    let u = counted(&cluster, "metered", want).await;
    assert_eq!(totals(&u), want, "{u:?}");
    assert_eq!(u.models.len(), 1, "{u:?}");
    assert_eq!((u.models[0].provider.as_str(), u.models[0].model.as_str()), ("scripted", "scripted"));
    assert_eq!(u.used_today, want.0 + want.1);
    assert_eq!(u.budget, 0);
    // Another tenant's usage is apart.
    assert!(usage(&cluster, 0, "other").await.models.is_empty());
}

#[tokio::test]
async fn a_tenant_over_its_budget_gets_the_typed_turn_end_in_a_cluster_while_another_runs() {
    let (_dir, path) = config_file("[tenants.capped]\ntoken_budget = 100\n");
    let config = path.display().to_string();
    let mut opts = ClusterOptions::new(1, 1);
    opts.worker_args = args(&["--config", &config]);
    opts.gateway_args = args(&["--config", &config]);
    let cluster = Cluster::start_with(opts).await.unwrap();

    let capped = session(&cluster, 0, "capped", "s");
    capped.followup(user_msg("m1", "[[usage:90,30]] one")).await.unwrap();
    capped.when_idle().await.unwrap();
    assert_eq!(totals(&counted(&cluster, "capped", (90, 30)).await), (90, 30));
    let watch = capped.watch().await.unwrap();
    capped.followup(user_msg("m2", "[[usage:1,1]] two")).await.unwrap();
    watch.wait_line("D turn/end 2 error*").await.unwrap();
    let (events, _) = capped.replay(0).await.unwrap();
    let reason = events
        .iter()
        .rev()
        .find_map(|e| match &e.payload {
            Some(Payload::TurnEnd(end)) => end.reason.clone()?.reason,
            _ => None,
        })
        .unwrap();
    let Reason::Error(error) = reason else { panic!("{reason:?}") };
    assert_eq!(error.code, "tenant_budget_exhausted");
    assert!(error.message.contains("daily token budget is 100"), "{}", error.message);
    let u = usage(&cluster, 0, "capped").await;
    assert_eq!((u.budget, u.used_today), (100, 120));
    assert_eq!(recorded(&events), (90, 30), "the refused step called no model");

    let free = session(&cluster, 0, "free", "s");
    free.followup(user_msg("f1", "[[usage:500,500]] go")).await.unwrap();
    free.when_idle().await.unwrap();
    let (events, _) = free.replay(0).await.unwrap();
    assert!(events.iter().any(|e| matches!(&e.payload, Some(Payload::TurnEnd(end))
        if matches!(end.reason.as_ref().and_then(|r| r.reason.as_ref()), Some(Reason::Completed(_))))));
}

/// The `retry-after-ms` a RESOURCE_EXHAUSTED refusal carries.
fn retry_after(status: &tonic::Status) -> Duration {
    let ms = status.metadata().get("retry-after-ms").and_then(|v| v.to_str().ok()?.parse().ok());
    Duration::from_millis(ms.unwrap_or_else(|| panic!("a refusal without retry-after-ms: {status:?}")))
}

#[tokio::test]
async fn a_tenants_request_rate_and_watch_limit_hold_across_two_gateways_together() {
    const RATE: u64 = 10;
    const BURST: u64 = 5;
    let (_dir, path) =
        config_file(&format!("[tenants.limited]\nrequests_per_s = {RATE}\nrequest_burst = {BURST}\nwatch_limit = 2\n"));
    let config = path.display().to_string();
    let mut opts = ClusterOptions::new(1, 2);
    opts.worker_args = args(&["--config", &config]);
    opts.gateway_args = args(&["--config", &config]);
    let cluster = Cluster::start_with(opts).await.unwrap();

    // Both gateways are asked as fast as they answer for `window`; together they admit at most
    // BURST + RATE × window (GCRA), however the requests spread over them.
    let window = Duration::from_secs(3);
    let started = Instant::now();
    let hammer = |g: usize| {
        let client = cluster.client(g);
        async move {
            let (mut admitted, mut refused) = (0u64, 0u64);
            while started.elapsed() < window {
                let request = GetUsageRequest { tenant: "limited".into(), since_unix_ms: 0 };
                match client.clone().get_usage(request).await {
                    Ok(_) => admitted += 1,
                    Err(status) if status.code() == Code::ResourceExhausted => {
                        assert!(status.message().contains("tenants.limited.requests_per_s"), "{status:?}");
                        assert!(status.message().contains("across all gateways"), "{status:?}");
                        refused += 1;
                    }
                    Err(status) => panic!("{status:?}"),
                }
            }
            (admitted, refused)
        }
    };
    let ((a0, r0), (a1, r1)) = tokio::join!(hammer(0), hammer(1));
    let elapsed = started.elapsed().as_secs_f64();
    let admitted = a0 + a1;
    let most = BURST + (RATE as f64 * elapsed).ceil() as u64;
    eprintln!("admitted {admitted} ({a0} + {a1}), refused {} over {elapsed:.2} s; at most {most}", r0 + r1);
    assert!(admitted <= most, "admitted {admitted} ({a0} + {a1}) over {elapsed:.2} s, more than {most}");
    assert!(admitted >= BURST, "admitted {admitted}: not even the burst");
    assert!(r0 + r1 > 0, "nothing was refused: the requests never went over the rate");

    // Watch slots: one per gateway takes the limit of 2; a third, on either, is refused until one ends.
    let watch = |g: usize| {
        let request = WatchRequest {
            session: Some(SessionRef { tenant: "limited".into(), id: "w".into() }),
            after_seq: 0,
            live: true,
            resume: None,
        };
        let mut client = cluster.client(g);
        // The rate limit applies to Watch calls too, and the hammer above spent it: a call the rate refuses
        // (its refusal names the rate's key) is made again after the wait the server says.
        async move {
            loop {
                match client.watch(request.clone()).await {
                    Err(status)
                        if status.code() == Code::ResourceExhausted
                            && status.message().contains("tenants.limited.requests_per_s") =>
                    {
                        tokio::time::sleep(retry_after(&status)).await;
                    }
                    answer => return answer,
                }
            }
        }
    };
    let first = watch(0).await.unwrap();
    let _second = watch(1).await.unwrap();
    let refused = watch(0).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("tenants.limited.watch_limit"), "{refused:?}");
    assert!(refused.message().contains("across the cluster's gateways"), "{refused:?}");
    drop(first);
    let until = Instant::now() + Duration::from_secs(10);
    let _third = loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        match watch(1).await {
            Ok(stream) => break stream,
            Err(status) if status.code() == Code::ResourceExhausted && Instant::now() < until => {}
            Err(status) => panic!("the slot of the dropped stream never freed: {status:?}"),
        }
    };
}

/// Issue 37 item 6: a `since` in the future is INVALID_ARGUMENT naming the field (no usage can be counted
/// there), on `turnstile dev`; a past one answers.
#[tokio::test]
async fn a_usage_since_in_the_future_is_invalid_argument() {
    let server = DevServer::start().await.unwrap();
    let mut client = server.client();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    for since in [now + 3_600_000, u64::MAX] {
        let err = client.get_usage(GetUsageRequest { tenant: String::new(), since_unix_ms: since }).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().starts_with("since_unix_ms: "), "{}", err.message());
    }
    client.get_usage(GetUsageRequest { tenant: String::new(), since_unix_ms: now - 60_000 }).await.unwrap();
    server.stop().await;
}
