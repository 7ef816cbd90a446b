//! The campaign's fault schedule: the seeded faults, each undone before the next, or the steps of a
//! rolling upgrade.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use turnstile_proto::v1::agent_client::AgentClient;
use turnstile_proto::v1::{GetSessionRequest, SessionRef};

use super::history::FaultRecord;
use super::workload::{Shared, req};
use super::{NODE_CUT, NODE_CUT_ROOM, SHARDS, TAKEOVER_BOUND};
use crate::{Cluster, HarnessError};

/// The fault kinds, in the order the report lists them.
pub(super) const KINDS: [&str; 11] = [
    "worker kill -9",
    "worker SIGSTOP/SIGCONT",
    "worker SIGTERM",
    "gateway kill -9",
    "gateway SIGSTOP/SIGCONT",
    "gateway SIGTERM",
    "nats kill -9 + restart",
    "nats KV leader kill -9 + restart",
    "overlap: nats + worker kill -9",
    "partition worker/NATS",
    "partition nats node + worker",
];

/// How long a rolling upgrade waits for a restarted worker's `/readyz` before it goes on to the next.
const READY_BOUND: Duration = Duration::from_secs(60);

/// The stream of the shard-lease KV bucket (`turnstile_shards`).
pub(super) const LEASE_STREAM: &str = "KV_turnstile_shards";

/// Runs the schedule until `duration` has passed: one fault at a time, held for a random while, undone,
/// then a random pause.
pub(super) async fn schedule(
    cluster: &mut Cluster,
    shared: &Shared,
    seed: u64,
    duration: Duration,
    partitions: bool,
    only: Option<&str>,
    sessions: &[SessionRef],
) -> Result<Vec<FaultRecord>, HarnessError> {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x5eed_fa17);
    let mut faults = Vec::new();
    let kinds: Vec<&'static str> =
        KINDS.iter().copied().filter(|k| partitions || !k.starts_with("partition")).collect();
    let kinds: Vec<&'static str> = kinds.into_iter().filter(|k| only.is_none_or(|o| k.contains(o))).collect();
    if kinds.is_empty() {
        return Err(HarnessError::io(
            "choosing faults",
            std::io::Error::other(format!("no fault kind matches {only:?}")),
        ));
    }
    let ms = |rng: &mut fastrand::Rng, lo: u64, hi: u64| Duration::from_millis(rng.u64(lo..hi));
    while shared.started.elapsed() < duration {
        tokio::time::sleep(ms(&mut rng, 500, 2500)).await;
        let mut kind = kinds[rng.usize(..kinds.len())];
        // Every run that can cuts a NATS node with its worker at least once: a short (CI) run draws about
        // 20 faults of 11 kinds and would miss it one time in six.
        let left = duration.saturating_sub(shared.started.elapsed());
        if kinds.contains(&NODE_CUT)
            && !faults.iter().any(|f: &FaultRecord| f.kind == NODE_CUT)
            && left < 2 * NODE_CUT_ROOM
            && left >= NODE_CUT_ROOM
        {
            kind = NODE_CUT;
        }
        // A cut of a NATS node with its worker lasts until the takeover (5–17 s measured): started near the
        // end it would stretch the run past its duration, so then another kind runs instead.
        if kind == NODE_CUT && left < NODE_CUT_ROOM && kinds.len() > 1 {
            let others: Vec<&'static str> = kinds.iter().copied().filter(|k| *k != kind).collect();
            kind = others[rng.usize(..others.len())];
        }
        let start_ms = shared.ms();
        let target;
        let (mut takeover_ms, mut inner_owned_at_heal, mut moved_sessions) = (None, None, 0);
        match kind {
            "worker kill -9" => {
                target = rng.usize(..cluster.workers());
                cluster.kill9_worker(target);
                tokio::time::sleep(ms(&mut rng, 500, 3000)).await;
                cluster.restart_worker(target).await?;
            }
            "worker SIGSTOP/SIGCONT" => {
                target = rng.usize(..cluster.workers());
                cluster.sigstop_worker(target);
                tokio::time::sleep(ms(&mut rng, 500, 4000)).await;
                cluster.sigcont_worker(target);
            }
            "worker SIGTERM" => {
                target = rng.usize(..cluster.workers());
                cluster.sigterm_worker(target, Duration::from_secs(15)).await;
                tokio::time::sleep(ms(&mut rng, 0, 2000)).await;
                cluster.restart_worker(target).await?;
            }
            "gateway kill -9" | "gateway SIGTERM" => {
                target = rng.usize(..cluster.gateways());
                if kind == "gateway kill -9" {
                    cluster.kill9_gateway(target);
                } else {
                    cluster.sigterm_gateway(target, Duration::from_secs(15)).await;
                }
                tokio::time::sleep(ms(&mut rng, 200, 2000)).await;
                cluster.restart_gateway(target).await?;
                if let Ok(mut g) = shared.gateways.write() {
                    g[target] = cluster.gateway_channel(target);
                }
                if let Ok(mut u) = shared.gateway_urls.write() {
                    u[target] = cluster.gateway_url(target);
                }
            }
            "gateway SIGSTOP/SIGCONT" => {
                target = rng.usize(..cluster.gateways());
                cluster.signal_gateway(target, "-STOP");
                tokio::time::sleep(ms(&mut rng, 500, 3000)).await;
                cluster.signal_gateway(target, "-CONT");
            }
            "nats kill -9 + restart" => {
                target = rng.usize(..cluster.nats_cluster().len());
                cluster.kill9_nats(target);
                tokio::time::sleep(ms(&mut rng, 1000, 5000)).await;
                cluster.restart_nats(target).await?;
                cluster.nats_cluster().wait_meta_leader().await?;
            }
            "nats KV leader kill -9 + restart" => {
                // The leader of the lease bucket's stream: every lease renewal goes through it.
                let nats = cluster.nats_cluster();
                let leader = nats.stream_leader(LEASE_STREAM).await;
                target = leader.and_then(|name| nats.index_of(&name)).unwrap_or_else(|| rng.usize(..nats.len()));
                cluster.kill9_nats(target);
                tokio::time::sleep(ms(&mut rng, 1000, 5000)).await;
                cluster.restart_nats(target).await?;
                cluster.nats_cluster().wait_meta_leader().await?;
            }
            "overlap: nats + worker kill -9" => {
                // Two faults at once: a worker's sessions move while the streams elect new leaders.
                target = rng.usize(..cluster.workers());
                let node = rng.usize(..cluster.nats_cluster().len());
                cluster.kill9_nats(node);
                tokio::time::sleep(ms(&mut rng, 0, 1000)).await;
                cluster.kill9_worker(target);
                tokio::time::sleep(ms(&mut rng, 500, 3000)).await;
                cluster.restart_worker(target).await?;
                tokio::time::sleep(ms(&mut rng, 0, 2000)).await;
                cluster.restart_nats(node).await?;
                cluster.nats_cluster().wait_meta_leader().await?;
            }
            NODE_CUT => {
                let Some(inner) = cluster.isolated_node().cloned() else { continue };
                target = inner.worker;
                let inner_id = cluster.worker_id(inner.worker);
                // The sessions the inner worker owns as the gateways see it (the shard map of the lease
                // bucket): after the cut each must show another owner.
                let mut moving = Vec::new();
                for s in sessions {
                    if owner_via(shared, 0, s).await.is_some_and(|o| o == inner_id) {
                        moving.push(s.clone());
                    }
                }
                moved_sessions = moving.len();
                inner.ns.partition()?;
                let cut = Instant::now();
                // Hold the cut until the other workers took over: the inner worker's leases expire (its
                // server has no quorum, so it cannot renew) and the two servers outside elect leaders for
                // whatever the inner one led. Every session it owned has another owner, and the other
                // workers' gauges add up to every shard (the gauges alone can be stale: a worker whose
                // leases lapsed reports them until its next round). Bounded; a cut that never sees the
                // takeover is a violation.
                let others: Vec<usize> = (0..cluster.workers()).filter(|w| *w != inner.worker).collect();
                loop {
                    let mut owned = 0;
                    for w in &others {
                        owned += cluster.shards_owned_by(*w).await.unwrap_or(0);
                    }
                    let mut moved = true;
                    for s in &moving {
                        moved &= owned_by_another(shared, s, &inner_id).await;
                    }
                    if owned == u64::from(SHARDS) && moved {
                        takeover_ms = Some(cut.elapsed().as_millis() as u64);
                        break;
                    }
                    if cut.elapsed() >= TAKEOVER_BOUND {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                tokio::time::sleep(ms(&mut rng, 500, 3000)).await;
                inner_owned_at_heal = cluster.shards_owned_by(inner.worker).await;
                inner.ns.heal()?;
                // The inner server routes to the others again and follows the meta leader before the next fault.
                cluster.nats_cluster().wait_meta_leader().await?;
            }
            _ => {
                let Some((w, ns)) = cluster.isolated_worker() else { continue };
                target = w;
                ns.partition()?;
                tokio::time::sleep(ms(&mut rng, 1500, 6000)).await;
                ns.heal()?;
            }
        }
        let record = FaultRecord { kind, target, start_ms, end_ms: shared.ms(), takeover_ms, inner_owned_at_heal };
        let takeover = match (kind.starts_with("partition nats"), takeover_ms) {
            (false, _) => String::new(),
            (true, Some(t)) => {
                format!(
                    "; others owned every shard after {t} ms ({moved_sessions} sessions moved), the cut-off worker {inner_owned_at_heal:?} at heal"
                )
            }
            (true, None) => format!("; the shards were NOT taken over within {} s", TAKEOVER_BOUND.as_secs()),
        };
        eprintln!("campaign: {:>6} ms  {kind} of #{target} ({} ms){takeover}", start_ms, record.end_ms - start_ms);
        faults.push(record);
    }
    Ok(faults)
}

/// The owner of `session` as gateway `g` reports it (`GetSession.owner`, from its shard map; empty while
/// the shard's lease is expired), `None` when it does not answer.
pub(super) async fn owner_via(shared: &Shared, g: usize, session: &SessionRef) -> Option<String> {
    let channel = shared.gateways.read().ok()?.get(g)?.clone();
    let request = req(GetSessionRequest { session: Some(session.clone()) });
    AgentClient::new(channel).get_session(request).await.ok().map(|r| r.into_inner().owner)
}

/// Whether some gateway names an owner of `session` other than `not` (a gateway whose NATS link crossed
/// the cut keeps its old map until its client gives that link up; the other shows the takeover).
pub(super) async fn owned_by_another(shared: &Shared, session: &SessionRef, not: &str) -> bool {
    for g in 0..2 {
        if owner_via(shared, g, session).await.is_some_and(|o| !o.is_empty() && o != not) {
            return true;
        }
    }
    false
}

/// The rolling upgrade instead of faults: some load on the old build, then each worker and each gateway in
/// turn stopped (SIGTERM: a worker drains and hands its shards over, as in a Kubernetes rolling update) and
/// started again on `new`, with load between the steps, then load on the new build alone.
pub(super) async fn upgrade_schedule(
    cluster: &mut Cluster,
    shared: &Shared,
    duration: Duration,
    new: PathBuf,
) -> Result<Vec<FaultRecord>, HarnessError> {
    let steps = (cluster.workers() + cluster.gateways() + 1) as u32;
    let pause = duration / steps;
    let mut faults = Vec::new();
    tokio::time::sleep(pause).await;
    cluster.set_bin(new);
    for target in 0..cluster.workers() {
        let start_ms = shared.ms();
        cluster.sigterm_worker(target, Duration::from_secs(15)).await;
        cluster.restart_worker(target).await?;
        let end_ms = shared.ms();
        faults.push(FaultRecord {
            kind: "upgrade worker",
            target,
            start_ms,
            end_ms,
            takeover_ms: None,
            inner_owned_at_heal: None,
        });
        // As a rolling update does (docs/OPERATIONS.md): the next worker is stopped only once this one is
        // ready, which it is once it holds its share of the shards (decision 0160). One that is not ready
        // in READY_BOUND is reported and the roll goes on; the checks then find what it left undone.
        let restarted = Instant::now();
        let ready = loop {
            if cluster.worker_ready(target).await == Some(true) {
                break true;
            }
            if restarted.elapsed() > READY_BOUND {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let waited = restarted.elapsed().as_millis();
        if ready {
            eprintln!(
                "campaign: {start_ms:>6} ms  worker #{target} runs the new build, ready {waited} ms after its start"
            );
        } else {
            eprintln!(
                "campaign: {start_ms:>6} ms  worker #{target} runs the new build, NOT READY {waited} ms after its start"
            );
        }
        tokio::time::sleep(pause).await;
    }
    for target in 0..cluster.gateways() {
        let start_ms = shared.ms();
        cluster.sigterm_gateway(target, Duration::from_secs(15)).await;
        cluster.restart_gateway(target).await?;
        if let Ok(mut g) = shared.gateways.write() {
            g[target] = cluster.gateway_channel(target);
        }
        if let Ok(mut u) = shared.gateway_urls.write() {
            u[target] = cluster.gateway_url(target);
        }
        faults.push(FaultRecord {
            kind: "upgrade gateway",
            target,
            start_ms,
            end_ms: shared.ms(),
            takeover_ms: None,
            inner_owned_at_heal: None,
        });
        eprintln!("campaign: {start_ms:>6} ms  gateway #{target} runs the new build");
        tokio::time::sleep(pause / 2).await;
    }
    Ok(faults)
}
