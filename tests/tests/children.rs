//! Child sessions (SPEC §13 `spawn_agent`) through the real binaries: the parent's call creates a child
//! configured with its agent and parent, waits for the child's turn and returns its last answer; the link is
//! visible (`GetSession.parent`, `ListSessions {parent}`); an unknown agent is an error result and creates
//! nothing; cancelling the parent cancels the child with cause `parent`. In a cluster the child runs on
//! another worker than the parent, and a kill -9 of the child's owner while the parent waits still gives the
//! parent its result.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use tokio::sync::watch;
use tonic::Code;
use turnstile_cluster::kv::{ClusterKv, ShardMap};
use turnstile_journal::{JetStreamConfig, JetStreamLog};
use turnstile_model::{child, shard::shard_of};
use turnstile_proto::v1::session_event::Payload;
use turnstile_proto::v1::{ListSessionsRequest, SessionRef};
use turnstile_tests::config::{config_args, config_file};
use turnstile_tests::{Backend, Cluster, ClusterOptions, DEFAULT_WAIT, DevOptions, DevServer, Session, user_msg};

/// A planner that may spawn, and a researcher that works (scripted model, so replies are `echo: …`).
const AGENTS: &str = "default_agent = \"planner\"\n\n\
    [agents.planner]\ntools = [\"spawn_agent\"]\n\n\
    [agents.researcher]\nsystem = \"You research.\"\ntools = [\"sleep\", \"echo\"]\n";

/// A dev server running [`AGENTS`] on `backend`.
async fn start(backend: Backend, path: &Path) -> DevServer {
    backend.start_dev_with(DevOptions { extra_args: config_args(path), ..DevOptions::default() }).await.unwrap()
}

/// The child that the parent's call `call_id` names.
fn child_of(parent: &Session, call_id: &str) -> SessionRef {
    let p = parent.reference();
    let c = child::session_of(&turnstile_model::SessionRef::new(&p.tenant, &p.id).unwrap(), call_id);
    SessionRef { tenant: c.tenant, id: c.id }
}

/// The `tool/result` of `call_id` in `s`'s log: (output, error).
async fn tool_result(s: &Session, call_id: &str) -> (String, Option<String>) {
    let (events, _) = s.replay(0).await.unwrap();
    events
        .iter()
        .find_map(|e| match &e.payload {
            Some(Payload::ToolResult(r)) if r.call_id == call_id => Some((r.output.clone(), r.error.clone())),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no tool/result of {call_id}: {events:#?}"))
}

/// The children `ListSessions {parent}` lists, by id.
async fn children_listed(s: &Session) -> Vec<String> {
    let r = s.reference();
    let request = ListSessionsRequest { tenant: r.tenant, parent: r.id, ..ListSessionsRequest::default() };
    let reply = s.client().list_sessions(request).await.unwrap().into_inner();
    reply.sessions.into_iter().map(|i| i.session.unwrap().id).collect()
}

async fn a_child_runs_its_agent_and_its_answer_is_the_parents_result(backend: Backend) {
    let (_dir, path) = config_file(AGENTS);
    let server = start(backend, &path).await;
    let parent = server.session();
    parent.followup(user_msg("P", "[[tool:spawn_agent researcher find the gate]] delegate")).await.unwrap();
    parent.when_idle().await.unwrap();
    assert_eq!(tool_result(&parent, "call-1-1-1").await, ("echo: find the gate".to_owned(), None));

    let child_ref = child_of(&parent, "call-1-1-1");
    let child = Session::with_ref(server.client(), child_ref.clone());
    let info = child.info().await.unwrap();
    assert_eq!(info.parent, Some(parent.reference()));
    assert_eq!((info.agent.as_str(), info.last_turn), ("researcher", 1));
    let (events, _) = child.replay(0).await.unwrap();
    match &events[0].payload {
        Some(Payload::SessionConfigured(c)) => {
            assert_eq!((c.agent.as_str(), c.parent.as_ref()), ("researcher", Some(&parent.reference())));
        }
        other => panic!("a child's first event is session/configured, got {other:?}"),
    }
    let prompt = events.iter().find_map(|e| match &e.payload {
        Some(Payload::UserMessage(m)) => m.message.clone(),
        _ => None,
    });
    assert_eq!(prompt.unwrap().id, "spawn:call-1-1-1");
    // The link is listed both ways: the parent has no parent, and lists the child.
    assert_eq!(parent.info().await.unwrap().parent, None);
    assert_eq!(children_listed(&parent).await, vec![child_ref.id.clone()]);
    assert!(children_listed(&child).await.is_empty());
    // The child is an ordinary session: it takes a followup of its own.
    child.followup(user_msg("C", "and more")).await.unwrap();
    assert_eq!(child.when_idle().await.unwrap().last_turn, 2);
}

async fn spawning_an_unknown_agent_is_an_error_result_and_creates_nothing(backend: Backend) {
    let (_dir, path) = config_file(AGENTS);
    let server = start(backend, &path).await;
    let parent = server.session();
    parent.followup(user_msg("P", "[[tool:spawn_agent writer write it]] delegate")).await.unwrap();
    parent.when_idle().await.unwrap();
    let child_ref = child_of(&parent, "call-1-1-1");
    let (output, error) = tool_result(&parent, "call-1-1-1").await;
    assert_eq!(output, "");
    assert_eq!(
        error.unwrap(),
        format!(
            "spawn_agent could not start child session {}/{}: agent \"writer\" is not configured; known agents: \
             planner, researcher, scripted",
            child_ref.tenant, child_ref.id
        )
    );
    let child = Session::with_ref(server.client(), child_ref);
    assert_eq!(child.info().await.unwrap_err().code(), Code::NotFound, "nothing was written");
    assert!(children_listed(&parent).await.is_empty());
}

async fn cancelling_the_parent_cancels_the_child_with_cause_parent(backend: Backend) {
    let (_dir, path) = config_file(AGENTS);
    let server = start(backend, &path).await;
    let parent = server.session();
    parent.followup(user_msg("P", "[[tool:spawn_agent researcher [[tool:sleep 60000]] dig]] delegate")).await.unwrap();
    let child = Session::with_ref(server.client(), child_of(&parent, "call-1-1-1"));
    let watch = child.watch().await.unwrap();
    watch.wait_line("D tool/call 1.1 sleep 60000").await.unwrap();
    parent.cancel(false).await.unwrap();
    watch.wait_line("D turn/end 1 aborted{parent}").await.unwrap();
    assert_eq!(child.when_idle().await.unwrap().last_turn, 1);
    let (_, error) = tool_result(&parent, "call-1-1-1").await;
    assert!(error.unwrap().contains("is being cancelled (cause parent)"));
    let (events, _) = parent.replay(0).await.unwrap();
    assert!(
        events.iter().any(|e| matches!(&e.payload, Some(Payload::TurnEnd(t)) if t.turn == 1)),
        "the parent's turn ended: {events:#?}"
    );
}

/// Children that may not spawn (depth 1), and at most two per session.
const LIMITED: &str = "default_agent = \"planner\"\n\n\
    [limits]\nmax_spawn_depth = 1\nmax_children = 2\n\n\
    [agents.planner]\ntools = [\"spawn_agent\"]\n\n\
    [agents.researcher]\ntools = [\"spawn_agent\", \"echo\"]\n";

async fn spawning_past_the_configured_depth_or_children_is_refused_with_its_code(backend: Backend) {
    let (_dir, path) = config_file(LIMITED);
    let server = start(backend, &path).await;
    let parent = server.session();
    // The child may not spawn a grandchild: its call's result is the typed error, and nothing is created.
    parent
        .followup(user_msg("P1", "[[tool:spawn_agent researcher [[tool:spawn_agent researcher deeper]] dig]] go"))
        .await
        .unwrap();
    parent.when_idle().await.unwrap();
    let child = Session::with_ref(server.client(), child_of(&parent, "call-1-1-1"));
    let (output, error) = tool_result(&child, "call-1-1-1").await;
    let error = error.expect("the grandchild is refused");
    assert_eq!(output, "");
    assert!(error.starts_with("spawn_depth_exceeded: session "), "{error}");
    assert!(error.contains("limits.max_spawn_depth (1)"), "{error}");
    let grandchild = Session::with_ref(server.client(), child_of(&child, "call-1-1-1"));
    assert_eq!(grandchild.info().await.unwrap_err().code(), Code::NotFound, "nothing was created");
    // The parent has one child; a second is allowed, a third refused.
    parent
        .followup(user_msg("P2", "[[tool:spawn_agent researcher two]] [[tool:spawn_agent researcher three]] more"))
        .await
        .unwrap();
    parent.when_idle().await.unwrap();
    assert_eq!(tool_result(&parent, "call-2-1-1").await.1, None, "the second child");
    let (_, error) = tool_result(&parent, "call-2-1-2").await;
    let error = error.expect("the third child is refused");
    assert!(error.starts_with("spawn_children_exceeded: session "), "{error}");
    assert!(error.contains("already has 2 child sessions"), "{error}");
    assert_eq!(children_listed(&parent).await.len(), 2);
}

turnstile_tests::backend_tests!(
    a_child_runs_its_agent_and_its_answer_is_the_parents_result,
    spawning_an_unknown_agent_is_an_error_result_and_creates_nothing,
    cancelling_the_parent_cancels_the_child_with_cause_parent,
    spawning_past_the_configured_depth_or_children_is_refused_with_its_code,
);

/// In the `cluster` test group (docs/TESTING.md): three workers and two gateways.
mod cluster {
    use super::*;

    const SHARDS: u32 = 256;

    /// The live shard map, read from the cluster's KV as the gateways read it.
    async fn shard_map(cluster: &Cluster) -> watch::Receiver<ShardMap> {
        let mut config = JetStreamConfig::new(cluster.nats_url());
        config.shards = SHARDS;
        let log = JetStreamLog::connect(config).await.unwrap();
        let kv = ClusterKv::open(log.client(), 1, SHARDS, Duration::from_secs(3)).await.unwrap();
        let map = kv.watch_shards().await.unwrap();
        // The watch fills in as the bucket's entries arrive: wait until every shard is held.
        let deadline = tokio::time::Instant::now() + DEFAULT_WAIT;
        loop {
            let held = {
                let (m, now) = (map.borrow(), turnstile_ops::clock::now_ms());
                (0..SHARDS).filter(|s| m.owner(*s, now).is_some()).count()
            };
            if held == SHARDS as usize {
                return map;
            }
            assert!(tokio::time::Instant::now() < deadline, "{held} of {SHARDS} shards held\n{}", cluster.logs());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn owner_of(map: &watch::Receiver<ShardMap>, tenant: &str, id: &str) -> Option<String> {
        let session = turnstile_model::SessionRef::new(tenant, id).unwrap();
        let now = turnstile_ops::clock::now_ms();
        map.borrow().owner(shard_of(&session, SHARDS), now).map(|l| l.owner.clone())
    }

    /// A parent whose child for `call-1-1-1` hashes to a shard another worker owns.
    async fn parent_apart_from_its_child(cluster: &Cluster) -> (Session, String, String) {
        let map = shard_map(cluster).await;
        for _ in 0..200 {
            let parent = cluster.session(0);
            let p = parent.reference();
            let c = child_of(&parent, "call-1-1-1");
            let (Some(po), Some(co)) = (owner_of(&map, &p.tenant, &p.id), owner_of(&map, &c.tenant, &c.id)) else {
                continue;
            };
            if po != co {
                return (parent, po, co);
            }
        }
        panic!("no parent id whose child lands on another worker in 200 tries\n{}", cluster.logs());
    }

    async fn cluster_with_agents(path: &Path) -> Cluster {
        let mut opts = ClusterOptions::new(3, 2);
        opts.worker_args = config_args(path);
        opts.gateway_args = config_args(path);
        let cluster = Cluster::start_with(opts).await.unwrap();
        cluster.wait_balanced().await.unwrap();
        cluster
    }

    #[tokio::test]
    async fn a_child_on_another_worker_answers_and_survives_a_kill_9_of_its_owner() {
        let (_dir, path) = config_file(AGENTS);
        let mut cluster = cluster_with_agents(&path).await;
        let (parent, parent_owner, child_owner) = parent_apart_from_its_child(&cluster).await;
        let child = Session::with_ref(cluster.client(1), child_of(&parent, "call-1-1-1"));
        let watch = child.watch().await.unwrap();
        parent
            .followup(user_msg("P", "[[tool:spawn_agent researcher [[tool:sleep 8000]] dig]] delegate"))
            .await
            .unwrap();
        watch.wait_line("D tool/call 1.1 sleep 8000").await.unwrap();
        assert_eq!(child.info().await.unwrap().owner, child_owner, "{}", cluster.logs());

        // The child's owner dies while the parent's call waits on it.
        cluster.kill9_worker(cluster.worker_index(&child_owner).unwrap());
        let deadline = tokio::time::Instant::now() + DEFAULT_WAIT;
        let idle = loop {
            match parent.when_idle().await {
                Ok(info) => break info,
                Err(s) if s.code() == Code::Unavailable && tokio::time::Instant::now() < deadline => {}
                Err(s) => panic!("the parent never went idle: {s:?}\n{}", cluster.logs()),
            }
        };
        assert_eq!(idle.owner, parent_owner, "the parent's worker lived");
        // The new owner repaired the child's turn (its `sleep` interrupted, never run again) and resumed it:
        // the resumed step answers the interrupted result (decision 0143); the parent got that answer.
        let (output, error) = tool_result(&parent, "call-1-1-1").await;
        let answer = "tool results: sleep failed: interrupted: the worker running this call stopped before it finished";
        assert_eq!((output.as_str(), error), (answer, None), "{:#?}", watch.lines());
        let lines = watch.settle(&child).await.unwrap();
        assert!(lines.contains(&"D turn/end 1 interrupted".to_owned()), "{lines:#?}");
        assert!(lines.contains(&"D turn/end 2 completed".to_owned()), "{lines:#?}");
        let info = child.info().await.unwrap();
        assert_ne!(info.owner, child_owner);
        assert_eq!(info.parent, Some(parent.reference()));
    }

    #[tokio::test]
    async fn cancelling_a_parent_cancels_its_child_on_another_worker() {
        let (_dir, path) = config_file(AGENTS);
        let cluster = cluster_with_agents(&path).await;
        let (parent, _, child_owner) = parent_apart_from_its_child(&cluster).await;
        let child = Session::with_ref(cluster.client(1), child_of(&parent, "call-1-1-1"));
        let watch = child.watch().await.unwrap();
        parent.followup(user_msg("P", "[[tool:spawn_agent researcher [[tool:sleep 60000]] dig]] go")).await.unwrap();
        watch.wait_line("D tool/call 1.1 sleep 60000").await.unwrap();
        assert_eq!(child.info().await.unwrap().owner, child_owner);
        cluster.session_via(1, &parent).cancel(false).await.unwrap();
        watch.wait_line("D turn/end 1 aborted{parent}").await.unwrap();
        assert_eq!(child.when_idle().await.unwrap().status, turnstile_proto::v1::SessionStatus::Idle as i32);
    }
}
