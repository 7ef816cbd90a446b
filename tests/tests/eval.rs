//! SPEC §20 evaluation against the real binary and its CLI: `turnstile eval` reruns 20 recorded turns (4
//! sessions × 5 turns on the scripted model) on a changed agent version, prints the old-beside-new table
//! and the JSON report, deletes every scratch session, and never selects another tenant's sessions or
//! sees its agents.
//!
//! The scripted model's `[[system]]` directive answers with the system prompt, so the turns that use it
//! change with the version (score 0 under `exact`) and the plain echo turns do not (score 1).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use tonic::transport::Channel;
use tonic::{Code, Request};
use turnstile_proto::v1::agent_client::AgentClient;
use turnstile_proto::v1::evaluate_item::Item;
use turnstile_proto::v1::{
    ConfigureSessionRequest, DeliverRequest, EvaluateRequest, ForkSessionRequest, GetSessionRequest,
    ListSessionsRequest, PutAgentRequest, SessionRef, SetLabelsRequest, WhenIdleRequest,
};
use turnstile_tests::binary::run_cli;
use turnstile_tests::config::{config_args, config_file};
use turnstile_tests::{Backend, Cluster, DevOptions, DevServer, user_msg};

const TOKEN_A: &str = "eval-tenant-a-0123456789";
const TOKEN_B: &str = "eval-tenant-b-0123456789";

fn authed<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

fn own(id: &str) -> Option<SessionRef> {
    Some(SessionRef { tenant: String::new(), id: id.into() })
}

async fn put_agent(c: &mut AgentClient<Channel>, token: &str, name: &str, definition: &str) -> u64 {
    let req = PutAgentRequest { name: name.into(), definition: definition.into(), format: 0 };
    c.put_agent(authed(req, token)).await.unwrap().into_inner().version
}

/// Records `turns` turns in session `id` on `agent`, labelled `suite=smoke` when `labelled`: odd turns echo,
/// even turns ask for the system prompt; each reports 10 input and 4 output tokens.
async fn record(c: &mut AgentClient<Channel>, token: &str, id: &str, agent: &str, turns: u64, labelled: bool) {
    let configure = ConfigureSessionRequest { session: own(id), agent: agent.into(), ..Default::default() };
    c.configure_session(authed(configure, token)).await.unwrap();
    if labelled {
        let labels = SetLabelsRequest {
            session: own(id),
            labels: [("suite".to_owned(), "smoke".to_owned())].into(),
            remove_keys: vec![],
        };
        c.set_labels(authed(labels, token)).await.unwrap();
    }
    for turn in 1..=turns {
        let text = if turn.is_multiple_of(2) {
            format!("[[system]] [[usage:10,4]] {id} turn {turn}")
        } else {
            format!("[[usage:10,4]] {id} turn {turn}")
        };
        let message = user_msg(&uuid::Uuid::new_v4().to_string(), &text);
        let deliver = DeliverRequest { session: own(id), message: Some(message), output_schema: None };
        c.followup(authed(deliver, token)).await.unwrap();
        c.when_idle(authed(WhenIdleRequest { session: own(id), timeout_ms: 20_000 }, token)).await.unwrap();
    }
}

/// The ids of the tenant's sessions that `selector` selects, read until `want` are listed (the index of a
/// JetStream journal is a mirror that catches up).
async fn listed(c: &mut AgentClient<Channel>, token: &str, selector: &str, want: usize) -> BTreeSet<String> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let req = ListSessionsRequest { label_selector: selector.into(), page_size: 1000, ..Default::default() };
        let sessions = c.list_sessions(authed(req, token)).await.unwrap().into_inner().sessions;
        let ids: BTreeSet<String> = sessions.into_iter().map(|s| s.session.unwrap().id).collect();
        if ids.len() == want || tokio::time::Instant::now() > deadline {
            return ids;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

async fn start(backend: Backend) -> (DevServer, tempfile::TempDir) {
    let (dir, path) = config_file("[agents.plain]\nsystem = \"plain\"\n");
    let tokens = dir.path().join("tokens.txt");
    std::fs::write(&tokens, format!("{TOKEN_A} tenant-a\n{TOKEN_B} tenant-b\n")).unwrap();
    let mut args = config_args(&path);
    args.extend(["--auth-tokens".to_owned(), tokens.display().to_string()]);
    let server = backend.start_dev_with(DevOptions { extra_args: args, ..DevOptions::default() }).await.unwrap();
    (server, dir)
}

async fn twenty_recorded_turns_against_a_changed_version_print_the_table_and_the_json(backend: Backend) {
    let (server, dir) = start(backend).await;
    let mut c = server.client();
    // Versions that pin: recorded sessions stay on v1 when v2 is put, and either can be evaluated.
    let v1 = "system = \"You are v1.\"\nversion_policy = \"pin\"";
    assert_eq!(put_agent(&mut c, TOKEN_A, "support", v1).await, 1);
    let ids_a = ["a-1", "a-2", "a-3", "a-4"];
    for id in ids_a {
        record(&mut c, TOKEN_A, id, "support", 5, true).await;
    }
    // Not selected: a session of tenant A without the label, and tenant B's labelled session.
    record(&mut c, TOKEN_A, "a-unlabelled", "support", 1, false).await;
    record(&mut c, TOKEN_B, "b-1", "plain", 2, true).await;
    assert_eq!(listed(&mut c, TOKEN_A, "suite=smoke", 4).await.len(), 4);
    assert_eq!(listed(&mut c, TOKEN_B, "suite=smoke", 1).await.len(), 1);
    let before = listed(&mut c, TOKEN_A, "", 5).await;
    assert_eq!(before.len(), 5);

    // The change: v2 has another system prompt.
    let v2 = "system = \"You are v2.\"\nversion_policy = \"pin\"";
    assert_eq!(put_agent(&mut c, TOKEN_A, "support", v2).await, 2);

    let report_path = dir.path().join("report.json");
    let report_arg = report_path.display().to_string();
    let extra = ["--parallel", "4", "--report", &report_arg];
    let out = run_cli(eval_args(server.url(), Some(TOKEN_A), "support", "suite=smoke", &extra)).await;
    assert!(out.success, "stdout: {}\nstderr: {}", out.stdout, out.stderr);
    let header = out.stdout.lines().next().unwrap();
    let columns: Vec<&str> = header.split("  ").map(str::trim).filter(|c| !c.is_empty()).collect();
    assert_eq!(
        columns,
        [
            "SESSION",
            "TURN",
            "OLD",
            "NEW",
            "OLD TOK",
            "NEW TOK",
            "OLD MS",
            "NEW MS",
            "OLD TOOLS",
            "NEW TOOLS",
            "OLD REPLY",
            "NEW REPLY"
        ]
    );
    assert_eq!(out.stdout.lines().count(), 1 + 20 + 1, "{}", out.stdout);
    assert!(out.stderr.contains("20/20 turns, 0 failed"), "{}", out.stderr);

    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report_path).unwrap()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 20);
    let run_id = report["started"]["runId"].as_str().unwrap().to_owned();
    assert_eq!(report["started"]["version"], "2");
    assert_eq!(report["started"]["scorer"], "exact");
    let mut seen = BTreeSet::new();
    for row in rows {
        let session = &row["session"];
        assert_eq!(session["tenant"], "tenant-a", "{row}");
        let id = session["id"].as_str().unwrap();
        assert!(ids_a.contains(&id), "{row}");
        let turn: u64 = row["turn"].as_str().unwrap().parse().unwrap();
        assert!(seen.insert((id.to_owned(), turn)), "a turn twice: {row}");
        assert_eq!(row.get("error"), None, "{row}");
        let (old, new) = (&row["recorded"], &row["candidate"]);
        // `exact` compares with the recorded reply, so the recorded side has no score.
        assert_eq!(old.get("score"), None, "{row}");
        assert_eq!((new["inputTokens"].as_str(), new["outputTokens"].as_str()), (Some("10"), Some("4")), "{row}");
        assert_eq!(old["endReason"], "completed");
        assert_eq!(new["endReason"], "completed");
        if turn.is_multiple_of(2) {
            assert_eq!(old["text"], "system: You are v1.", "{row}");
            assert_eq!(new["text"], "system: You are v2.", "{row}");
            assert_eq!(new["score"].get("value"), None, "a 0 score is left out of the JSON mapping: {row}");
            assert_eq!(new["score"].get("passed"), None, "{row}");
        } else {
            let echoed = format!("echo: {id} turn {turn}");
            assert_eq!((old["text"].as_str(), new["text"].as_str()), (Some(&*echoed), Some(&*echoed)), "{row}");
            assert_eq!((new["score"]["value"].as_f64(), new["score"]["passed"].as_bool()), (Some(1.0), Some(true)));
        }
    }
    assert_eq!(seen.len(), 20);
    let summary = &report["summary"];
    assert_eq!((summary["total"].as_u64(), summary["evaluated"].as_u64()), (Some(20), Some(20)), "{summary}");
    assert_eq!(summary.get("failed"), None, "{summary}");
    // Turns 1, 3 and 5 of each session echo as recorded; turns 2 and 4 answer v2's prompt.
    assert_eq!(summary["candidatePassed"].as_u64(), Some(12), "{summary}");
    assert_eq!(summary["candidateMean"].as_f64(), Some(0.6), "{summary}");
    assert_eq!(summary["candidateTokens"].as_str(), Some("280"), "{summary}");
    assert_eq!(summary["scratchDeleted"].as_u64(), Some(20), "{summary}");
    assert_eq!(summary.get("scratchLeft"), None, "{summary}");

    // Every scratch session is gone: by label, by id, and the tenant holds what it held before.
    assert!(listed(&mut c, TOKEN_A, &format!("turnstile/eval={run_id}"), 0).await.is_empty());
    assert!(listed(&mut c, TOKEN_A, "turnstile/eval", 0).await.is_empty());
    for index in 0..20 {
        let req = GetSessionRequest { session: own(&format!("eval-{run_id}-{index}")) };
        assert_eq!(c.get_session(authed(req, TOKEN_A)).await.unwrap_err().code(), Code::NotFound);
    }
    assert_eq!(listed(&mut c, TOKEN_A, "", 5).await, before);

    // `--fail-below` gates on the new mean (0.6 here), after printing the table.
    let gated =
        |bar: &str| run_cli(eval_args(server.url(), Some(TOKEN_A), "support", "suite=smoke", &["--fail-below", bar]));
    let out = gated("0.9").await;
    assert!(!out.success);
    assert!(out.stdout.starts_with("SESSION"), "{}", out.stdout);
    assert!(out.stderr.contains("the new replies' mean score 0.60 is below --fail-below 0.9"), "{}", out.stderr);
    assert!(gated("0.5").await.success);

    // `--json` prints the same report on stdout; a range takes only those turns.
    let extra = ["--json", "--agent-version", "1", "--turns", "2..3"];
    let out = run_cli(eval_args(server.url(), Some(TOKEN_A), "support", "suite=smoke", &extra)).await;
    assert!(out.success, "{}", out.stderr);
    let report: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 8);
    assert!(rows.iter().all(|r| r["candidate"]["score"]["value"].as_f64() == Some(1.0)), "v1 answers as recorded");

    // Tenant B: the same selector selects only its own session, and tenant A's agent does not exist for it.
    let mut stream = c
        .evaluate(authed(
            EvaluateRequest { agent: "plain".into(), label_selector: "suite=smoke".into(), ..Default::default() },
            TOKEN_B,
        ))
        .await
        .unwrap()
        .into_inner();
    let mut sessions = BTreeSet::new();
    while let Some(item) = stream.message().await.unwrap() {
        if let Some(Item::Row(row)) = item.item {
            let s = row.session.unwrap();
            sessions.insert((s.tenant, s.id));
        }
    }
    assert_eq!(sessions, BTreeSet::from([("tenant-b".to_owned(), "b-1".to_owned())]));
    let err = c
        .evaluate(authed(EvaluateRequest { agent: "support".into(), ..Default::default() }, TOKEN_B))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{}", err.message());
    // Naming tenant A's session is NOT_FOUND, as for a session that does not exist.
    let named = EvaluateRequest {
        agent: "plain".into(),
        sessions: vec![SessionRef { tenant: "tenant-a".into(), id: "a-1".into() }],
        ..Default::default()
    };
    let err = c.evaluate(authed(named, TOKEN_B)).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{}", err.message());
}

async fn bad_requests_name_the_field_and_the_limit(backend: Backend) {
    let (server, _dir) = start(backend).await;
    let mut c = server.client();
    record(&mut c, TOKEN_A, "a-1", "plain", 1, true).await;
    put_agent(&mut c, TOKEN_A, "loose", "system = \"one\"").await;
    put_agent(&mut c, TOKEN_A, "loose", "system = \"two\"").await;
    let refused = |req: EvaluateRequest| {
        let mut c = c.clone();
        async move { c.evaluate(authed(req, TOKEN_A)).await.unwrap_err() }
    };
    let e = refused(EvaluateRequest::default()).await;
    assert_eq!(
        (e.code(), e.message()),
        (Code::InvalidArgument, "agent: is empty; name the agent to run the turns on (ListAgents lists yours)")
    );
    let e = refused(EvaluateRequest { agent: "plain".into(), parallel: 17, ..Default::default() }).await;
    assert_eq!(
        (e.code(), e.message()),
        (Code::InvalidArgument, "parallel: 17 is over the limit of 16; ask for at most 16")
    );
    let e =
        refused(EvaluateRequest { agent: "plain".into(), label_selector: "suite=none".into(), ..Default::default() })
            .await;
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().starts_with("the selection holds no ended turn"), "{}", e.message());
    let e = refused(EvaluateRequest { agent: "plain".into(), first_turn: 3, last_turn: 2, ..Default::default() }).await;
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = refused(EvaluateRequest { agent: "nobody".into(), ..Default::default() }).await;
    assert_eq!(e.code(), Code::NotFound);
    // A version that does not pin cannot be run once a newer one exists: a session would run the newest.
    let e = refused(EvaluateRequest { agent: "loose".into(), version: 1, ..Default::default() }).await;
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().starts_with("agent: version 1 of agent \"loose\" does not pin"), "{}", e.message());
    let schema = turnstile_proto::v1::EvalScorer {
        kind: Some(turnstile_proto::v1::eval_scorer::Kind::JsonSchema(turnstile_proto::v1::JsonSchemaScorer {
            schema_json: r#"{"type": 3}"#.into(),
        })),
    };
    let e = refused(EvaluateRequest { agent: "plain".into(), scorer: Some(schema), ..Default::default() }).await;
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().starts_with("scorer.json_schema.schema_json: not a valid JSON Schema"), "{}", e.message());
    let hook = turnstile_proto::v1::EvalScorer {
        kind: Some(turnstile_proto::v1::eval_scorer::Kind::Hook(turnstile_proto::v1::HookScorer {
            url: "http://127.0.0.1:9/score".into(),
            timeout_ms: 0,
        })),
    };
    let e = refused(EvaluateRequest { agent: "plain".into(), scorer: Some(hook), ..Default::default() }).await;
    assert_eq!(e.code(), Code::InvalidArgument, "a loopback hook is refused unless the operator allows it");
    assert!(e.message().starts_with("scorer.hook.url: "), "{}", e.message());
}

/// In a cluster (3 workers, 2 gateways on JetStream): turns recorded through one gateway, in sessions that
/// several workers own, are evaluated through the other; every rerun runs on its scratch session's owner,
/// and every scratch session is deleted.
#[tokio::test]
async fn a_cluster_evaluates_through_either_gateway_and_leaves_no_scratch_session() {
    let cluster = Cluster::start(3, 2).await.unwrap();
    let mut c0 = cluster.client(0);
    let ids = ["c-1", "c-2", "c-3"];
    for id in ids {
        let mut c = c0.clone();
        let configure = ConfigureSessionRequest { session: own(id), agent: "scripted".into(), ..Default::default() };
        c.configure_session(configure).await.unwrap();
        let labels = SetLabelsRequest {
            session: own(id),
            labels: [("suite".to_owned(), "cluster".to_owned())].into(),
            remove_keys: vec![],
        };
        c.set_labels(labels).await.unwrap();
        for turn in 1..=2 {
            let message = user_msg(&uuid::Uuid::new_v4().to_string(), &format!("[[usage:3,2]] {id} {turn}"));
            c.followup(DeliverRequest { session: own(id), message: Some(message), output_schema: None }).await.unwrap();
            c.when_idle(WhenIdleRequest { session: own(id), timeout_ms: 20_000 }).await.unwrap();
        }
    }
    // The other gateway's index mirror lists them once it caught up.
    let mut c1 = cluster.client(1);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let req = ListSessionsRequest { label_selector: "suite=cluster".into(), ..Default::default() };
        if c1.list_sessions(req).await.unwrap().into_inner().sessions.len() == ids.len() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "gateway 1 never listed the sessions");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let out = run_cli(eval_args(cluster.gateway_url(1), None, "scripted", "suite=cluster", &["--json"])).await;
    assert!(out.success, "{}", out.stderr);
    let report: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let summary = &report["summary"];
    assert_eq!((summary["total"].as_u64(), summary["candidatePassed"].as_u64()), (Some(6), Some(6)), "{report}");
    assert_eq!(summary["scratchDeleted"].as_u64(), Some(6), "{summary}");
    for row in report["rows"].as_array().unwrap() {
        assert_eq!(row["recorded"]["text"], row["candidate"]["text"], "{row}");
        assert_eq!(row["candidate"]["inputTokens"], "3", "{row}");
    }
    let run_id = report["started"]["runId"].as_str().unwrap();
    for index in 0..6 {
        let req = GetSessionRequest { session: own(&format!("eval-{run_id}-{index}")) };
        assert_eq!(c0.get_session(req).await.unwrap_err().code(), Code::NotFound);
    }
}

/// A session forked from another numbers its own turns after the fork point; its first own turn starts from
/// the fork's `session/forked`, so the rerun forks the fork there.
async fn a_forked_sessions_first_own_turn_is_rerun_from_its_fork_point(backend: Backend) {
    let (server, _dir) = start(backend).await;
    let mut c = server.client();
    record(&mut c, TOKEN_A, "origin", "plain", 2, false).await;
    let fork = ForkSessionRequest { session: own("origin"), at_turn: 2, new_session: "branch".into() };
    c.fork_session(authed(fork, TOKEN_A)).await.unwrap();
    let message = user_msg(&uuid::Uuid::new_v4().to_string(), "[[usage:1,1]] on the branch");
    let deliver = DeliverRequest { session: own("branch"), message: Some(message), output_schema: None };
    c.followup(authed(deliver, TOKEN_A)).await.unwrap();
    c.when_idle(authed(WhenIdleRequest { session: own("branch"), timeout_ms: 20_000 }, TOKEN_A)).await.unwrap();
    let req =
        EvaluateRequest { agent: "plain".into(), sessions: own("branch").into_iter().collect(), ..Default::default() };
    let mut stream = c.evaluate(authed(req, TOKEN_A)).await.unwrap().into_inner();
    let mut rows = Vec::new();
    while let Some(item) = stream.message().await.unwrap() {
        if let Some(Item::Row(row)) = item.item {
            rows.push(row);
        }
    }
    assert_eq!(rows.len(), 1, "only the branch's own turn: {rows:?}");
    let row = &rows[0];
    assert_eq!((row.turn, row.error.as_str()), (3, ""), "{row:?}");
    assert_eq!(row.candidate.as_ref().unwrap().text, "echo: on the branch");
    assert_eq!(row.candidate.as_ref().unwrap().score.as_ref().unwrap().value, 1.0);
}

/// `model` reruns on another model as a session override: the agent that lists it in `overrides.models` runs
/// every turn; one that does not allow it fails each row with the configure error naming `overrides.model`.
async fn another_model_runs_where_the_agent_allows_it_and_each_row_says_why_where_not(backend: Backend) {
    let (server, _dir) = start(backend).await;
    let mut c = server.client();
    record(&mut c, TOKEN_A, "a-1", "plain", 2, false).await;
    put_agent(&mut c, TOKEN_A, "open", "system = \"open\"\n[overrides]\nmodels = [\"scripted\"]").await;
    let rows_of = |agent: &'static str| {
        let mut c = c.clone();
        async move {
            let req = EvaluateRequest {
                agent: agent.into(),
                model: "scripted".into(),
                sessions: own("a-1").into_iter().collect(),
                ..Default::default()
            };
            let mut stream = c.evaluate(authed(req, TOKEN_A)).await.unwrap().into_inner();
            let mut rows = Vec::new();
            while let Some(item) = stream.message().await.unwrap() {
                if let Some(Item::Row(row)) = item.item {
                    rows.push(row);
                }
            }
            rows.sort_by_key(|r| r.turn);
            rows
        }
    };
    let allowed = rows_of("open").await;
    assert_eq!(allowed.iter().map(|r| (r.turn, r.error.as_str())).collect::<Vec<_>>(), [(1, ""), (2, "")]);
    assert_eq!(allowed[1].candidate.as_ref().unwrap().text, "system: open");
    let refused = rows_of("plain").await;
    assert_eq!(refused.len(), 2);
    for row in &refused {
        assert!(row.candidate.is_none(), "{row:?}");
        assert!(row.error.starts_with("configure: overrides.model: "), "{row:?}");
    }
}

turnstile_tests::backend_tests!(
    twenty_recorded_turns_against_a_changed_version_print_the_table_and_the_json,
    bad_requests_name_the_field_and_the_limit,
    a_forked_sessions_first_own_turn_is_rerun_from_its_fork_point,
    another_model_runs_where_the_agent_allows_it_and_each_row_says_why_where_not
);

/// `turnstile eval --addr ADDR [--token TOKEN] --agent AGENT --label SELECTOR`, then `extra`.
fn eval_args(addr: String, token: Option<&str>, agent: &str, label: &str, extra: &[&str]) -> Vec<String> {
    let mut args = vec!["eval".to_owned(), "--addr".to_owned(), addr];
    if let Some(token) = token {
        args.extend(["--token".to_owned(), token.to_owned()]);
    }
    args.extend(["--agent", agent, "--label", label].map(str::to_owned));
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    args
}
